"""The built-in outbox target `webhook`: one HTTP call per perform or check, under a total deadline.

Owns: what an answer means to the relay (jobs/effects/outbox.py), as the receiver contract
(docs/effects.md) defines it:
- a call (POST): 2xx performed; 4xx or 503 refused, not performed; any other answer (500, 502,
  504, ...), a timeout, a cut connection or the total deadline: the outcome is *unknown*
  (`OutcomeUnknown`) -- the relay reconciles before anything is sent again;
- a check (GET): only 200 says performed; 404 not performed (and from now on no call with a
  lower relay token will be); any other answer, 2xx included (202, 204: "accepted, still
  deciding"), cannot tell yet (`OutcomeUnknown`), so a receiver that is still deciding never
  gets its intent closed unperformed.

Never: waits longer than `timeout` for one call in all -- resolving, connecting, TLS, sending,
the answer (jobs/effects/exchange.py) -- so a target that drops SYNs or trickles bytes cannot
hold a relay thread for ever; calls what http.client would not write (`validate` refuses a
space, a control character, a non-ASCII path or query); records as unknown a call that failed
before its first byte left (`Refused`). Reads at most MAX_ANSWER bytes of an answer.

A check's URL is `check_url` with `key` and `token` added to its own query (which is kept as
written; its fragment, never sent, is dropped), so a receiver reads the key it is asked about;
a `check_url` already holding either parameter is refused at `ctx.intent()`.

Hazards: the URL comes from the handler's code: never build it from a job's payload without an
allow-list.
"""

import json
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from jobs.core import lanes
from jobs.core.exceptions import InvalidOption
from jobs.effects.exchange import Call, OutcomeUnknown, Refused

TOKEN_HEADER = "X-Relay-Token"
KEY_HEADER = "Idempotency-Key"
MAX_TIMEOUT = 25.0  # seconds for one exchange: well within the relay's 60 s lease
CHECK_PARAMETERS = ("key", "token")  # what the relay adds to a check_url's query
_UNWRITABLE = re.compile(r"[\x00-\x20\x7f]")  # what http.client refuses in a request line


class WebhookTarget:
    """POSTs `data["json"]` to `data["url"]` with the key (`Idempotency-Key`) and the relay's
    fencing token (`X-Relay-Token`). Reconciliation (optional): with `data["check_url"]`, a GET
    of that URL with `key=<key>&token=<token>` added to its query: 200 has it, 404 has not (and
    fences lower tokens out), any other answer cannot tell yet."""

    def __init__(self, timeout: float = 10.0) -> None:
        # A number of seconds in (0, MAX_TIMEOUT]: a check, and then a call, each run under the
        # relay's claim (jobs/effects/outbox.py: a 60 s lease, renewed as the call begins), so a
        # deadline near the lease let the relay take the intent over from its own call still in
        # flight; zero, a negative, NaN or infinity refused every call ("nothing sent") for 24 h.
        ok = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if not ok or not 0 < timeout <= MAX_TIMEOUT:
            raise InvalidOption(
                f"WebhookTarget(timeout={timeout!r:.40}): seconds, more than 0 and at most "
                f"{MAX_TIMEOUT:g} (within the relay's lease)"
            )
        self.timeout = float(timeout)

    @staticmethod
    def _url(data: Any, name: str) -> str:
        """`data[name]` if the relay can call it, else InvalidOption saying why."""
        url = data.get(name) if isinstance(data, dict) else None
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
            ok = ok and (parts is None or parts.port is None or parts.port > 0)
        except ValueError:  # a port out of range or not a number, a bad IPv6 literal
            ok = False
        if not ok or not isinstance(url, str) or parts is None:
            raise InvalidOption(f"webhook: data[{name!r}] must be an http(s) URL with a host")
        if (bad := _UNWRITABLE.search(url)) is not None:
            raise InvalidOption(
                f"webhook: data[{name!r}] holds {bad.group()!r} at {bad.start()}: a URL is sent "
                "without spaces or control characters (percent-encode them)"
            )
        if not (parts.path + parts.query).isascii():
            raise InvalidOption(
                f"webhook: data[{name!r}] holds a non-ASCII character in its path or query: "
                "percent-encode it (urllib.parse.quote)"
            )
        if len(url) > lanes.MAX_URL:
            raise InvalidOption(
                f"webhook: data[{name!r}] is longer than {lanes.MAX_URL} characters"
            )
        if lanes.origin(url) is None:  # a host neither a name nor an address (or not IDNA)
            raise InvalidOption(f"webhook: data[{name!r}] has a host the relay cannot call")
        return url

    @classmethod
    def _check_url(cls, data: Any) -> str:
        url = cls._url(data, "check_url")
        names = {k for k, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
        if clash := sorted(names.intersection(CHECK_PARAMETERS)):
            raise InvalidOption(
                f"webhook: data['check_url'] already has {', '.join(clash)} in its query: "
                "the relay adds key and token there"
            )
        return url

    def validate(self, data: Any) -> None:
        """At `ctx.intent()`: the URLs the relay will call, so a bad one is the handler's clear
        error rather than an intent the relay can only park."""
        self._url(data, "url")
        if isinstance(data, dict) and "check_url" in data:
            self._check_url(data)

    def perform(self, key: str, data: Any, token: int = 0) -> None:
        try:
            url = self._url(data, "url")  # a row stored before a check: never sent, not unknown
        except InvalidOption as exc:
            raise Refused(str(exc)) from exc
        body = json.dumps(data.get("json") if isinstance(data, dict) else None).encode()
        headers = {"Content-Type": "application/json", KEY_HEADER: key, TOKEN_HEADER: str(token)}
        status = Call(url, self.timeout).run("POST", body, headers)
        if 200 <= status < 300:
            return
        if 400 <= status < 500 or status == 503:
            raise Refused(f"webhook refused the call: {status}")
        raise OutcomeUnknown(f"webhook answered {status}")

    @staticmethod
    def check(check_url: str, key: str, token: int) -> str:
        """The check's URL: `check_url` with key and token added to its query (kept as written),
        without its fragment (never sent: a query written after it would not be either)."""
        parts = urlsplit(check_url)
        ours = urlencode({"key": key, "token": int(token)})
        query = f"{parts.query}&{ours}" if parts.query else ours
        return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))

    def reconcile(self, key: str, data: Any, token: int = 0) -> bool | None:
        if not isinstance(data, dict) or "check_url" not in data:
            return None
        try:
            check_url = self._check_url(data)
        except InvalidOption:  # a row stored before the check: it can never answer for this key
            return None
        headers = {KEY_HEADER: key, TOKEN_HEADER: str(token)}
        status = Call(self.check(check_url, key, token), self.timeout).run("GET", None, headers)
        if status == 200:  # the contract's only "performed": a 202 or 204 cannot tell yet
            return True
        if status == 404:
            return False
        raise OutcomeUnknown(f"webhook check answered {status}: cannot tell yet")
