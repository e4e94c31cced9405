"""Outbox lanes: what one hanging downstream may hold up (the relay, jobs/effects/relay.py, bounds
calls in flight per lane).

Owns: the one pure function naming an intent's lane. Every insert stores it in `jobs_intent.lane`
(the commit statements, jobs/core/sql/, from `IntentRow.lane`; the model for rows planted through
the ORM), and the relay compares that stored value by equality, in its claim's SQL and in its
count of calls in flight, so the two can never disagree.

A lane is the target, or, when the data names a URL (`data["url"]`), the target and that URL's
origin spelled one way: scheme and host lower-cased, userinfo dropped, a host's trailing dot
dropped, an IDN host in its ASCII (IDNA) form, an IPv4 address in any spelling `inet_aton` takes
(`127.1`, `0x7f.0.0.1`) as a dotted quad, an IPv6 address compressed between brackets (an
IPv4-mapped one as its IPv4 address), the scheme's default port dropped (http 80, https 443), any
other port kept. So http://H.:80/, HTTP://user@h and http://h name one lane.

Never: raises -- the URL is a handler's value, taken at `ctx.intent()`, and a raise in the commit
path would fail the batch-mates' commits too. A URL that cannot be parsed (not a string, no host,
a bad port, a host that is no hostname or address, longer than MAX_URL) gets the target's own
UNPARSED lane, which no origin can spell (an origin begins with a scheme's letter). Never resolves
a name: two names for one server (localhost, 127.0.0.1) are two lanes.

Bounded: a lane longer than MAX_LANE is cut and ends in `~` and a digest of the whole, so two long
origins stay two lanes (no origin contains `~`).
"""

import hashlib
import ipaddress
import re
import socket
from typing import Any
from urllib.parse import urlsplit

MAX_LANE = 200  # jobs_intent.lane is varchar(MAX_LANE)
MAX_URL = 8 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443}
UNPARSED = "!unparsed"

_HOSTNAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_NUMERIC = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}")
_MISSING = object()


def lane(target: str, data: Any) -> str:
    """The lane of an intent for `target` with `data` (any value: never raises)."""
    url = dict.get(data, "url", _MISSING) if isinstance(data, dict) else _MISSING
    if url is _MISSING:
        return _bounded(str(target))
    return _bounded(f"{target} {origin(url) or UNPARSED}")


def origin(url: object) -> str | None:
    """`scheme://host[:port]` of `url`, normalised; None when it cannot be parsed."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        return None
    try:  # a str subclass's own methods are never called: this is the text json encoded
        parts = urlsplit(str.__getitem__(url, slice(None)))
        host, port = parts.hostname, parts.port
    except ValueError:  # a bad port, a bad bracketed address
        return None
    if not parts.scheme or not host:
        return None
    host = _host(host)
    if host is None:
        return None
    if port is None or port == DEFAULT_PORTS.get(parts.scheme):
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}://{host}:{port}"


def _host(host: str) -> str | None:
    """A lower-cased host (urlsplit's `hostname`) spelled one way, or None."""
    if ":" in host:  # an IPv6 address: urlsplit took it from between brackets
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            return None
        mapped = address.ipv4_mapped
        return str(mapped) if mapped is not None else f"[{address.compressed}]"
    host = host.rstrip(".")
    if not host.isascii():
        try:  # as the socket module encodes a name before it resolves it
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            return None
    if not _HOSTNAME.fullmatch(host):
        return None
    if _NUMERIC.fullmatch(host):  # 127.1, 0x7f.1, 2130706433: one IPv4 address, many spellings
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return None
    return host


def _bounded(name: str) -> str:
    if len(name) <= MAX_LANE:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{name[: MAX_LANE - 17]}~{digest}"
