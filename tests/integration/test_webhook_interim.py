"""A receiver's informational (1xx) answers are not its answer: the webhook reads on to the final
one (RFC 9110 15.2: a client must parse any number of 1xx answers before the final one, even
unasked for).

Before, http.client skipped only `100 Continue`: a `103 Early Hints` or `102 Processing` before
the receiver's `200` was taken for the answer itself -- the call recorded as an unknown outcome
and reconciled (a second request, the intent's failures and backoff counted), a check's `404`
after a 103 read as "cannot tell yet". A 1xx and then nothing (the connection closed, or the
deadline) is still unknown: the request arrived and no final answer came. A `101 Switching
Protocols` the relay never asked for is no final answer either: unknown.

The receivers are real sockets scripted byte for byte (tests/slow_receivers.py). Also here: a call
whose deadline timer cannot start sent nothing (Refused), never an unknown outcome.
"""

import threading
import time

import pytest

import jobs
from jobs.effects import exchange, outbox
from jobs.effects.exchange import MAX_INTERIM
from jobs.effects.webhook import OutcomeUnknown, Refused, WebhookTarget
from jobs.models import Intent
from tests.integration.attempts import claim
from tests.slow_receivers import scripted_server

pytestmark = pytest.mark.django_db(transaction=True)

HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _final(status: str) -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".encode()


def _perform(url: str, timeout: float = 2.0) -> BaseException | None:
    try:
        WebhookTarget(timeout=timeout).perform("1:s", {"url": f"{url}/hook", "json": {}}, 1)
    except (OutcomeUnknown, Refused) as exc:
        return exc
    return None


@pytest.mark.parametrize(
    "interim", [HINTS, PROCESSING, CONTINUE, HINTS + PROCESSING + HINTS], ids=repr
)
def test_a_call_answered_1xx_then_200_is_performed(interim):
    with scripted_server(interim + _final("200 OK")) as s:
        assert _perform(s.url) is None
        assert len(s.requests) == 1


def test_a_call_answered_1xx_then_409_is_refused():
    with scripted_server(HINTS + _final("409 Conflict")) as s:
        assert isinstance(_perform(s.url), Refused)


@pytest.mark.parametrize("only", [HINTS, CONTINUE, PROCESSING], ids=repr)
def test_a_call_answered_only_1xx_is_an_unknown_outcome(only):
    with scripted_server(only) as s:  # then the connection closes: no final answer
        error = _perform(s.url)
    assert isinstance(error, OutcomeUnknown), error


def test_a_call_answered_1xx_then_held_is_unknown_at_the_deadline():
    with scripted_server(HINTS, hold=10) as s:
        error = _perform(s.url)
    assert isinstance(error, OutcomeUnknown) and "no answer within" in str(error), error


def test_an_unasked_101_switching_protocols_is_an_unknown_outcome():
    with scripted_server(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n") as s:
        error = _perform(s.url)
    assert isinstance(error, OutcomeUnknown), error


@pytest.mark.parametrize(("final", "found"), [("200 OK", True), ("404 Not Found", False)])
def test_a_check_answered_1xx_then_its_verdict_reads_the_verdict(final, found):
    with scripted_server(HINTS + _final(final)) as s:
        data = {"url": f"{s.url}/hook", "check_url": f"{s.url}/check"}
        assert WebhookTarget(timeout=2.0).reconcile("1:s", data, 3) is found


def test_a_relayed_intent_answered_with_early_hints_is_done_at_the_first_call():
    with scripted_server(HINTS + _final("200 OK")) as s:
        jobs.enqueue("test.echo")
        running = claim("host-a:1")
        running.ctx.intent("publish", "webhook", {"url": f"{s.url}/hook", "json": {"n": 1}})
        running.commit(None)
        assert outbox.relay_once("relay-hints") == 1
        row = Intent.objects.get()
        assert (row.state, row.performs, row.failures, row.outcome_unknown) == (
            "done",
            1,
            0,
            False,
        ), row.last_error
        assert len(s.requests) == 1


def test_a_receiver_streaming_1xx_answers_is_cut_off_long_before_the_deadline():
    # A stream of interim answers was read at full speed until the deadline (a relay thread
    # busy for 10 s; a 100 Continue stream before this fix as well). Past MAX_INTERIM of them
    # there is no final answer: unknown, at once.
    endless = (HINTS + CONTINUE) * 10_000
    with scripted_server(endless, hold=20) as s:
        started = time.monotonic()
        error = _perform(s.url, timeout=20.0)
        assert time.monotonic() - started < 5
    assert isinstance(error, OutcomeUnknown) and f"more than {MAX_INTERIM}" in str(error), error
    with scripted_server(HINTS * MAX_INTERIM + _final("200 OK")) as s:
        assert _perform(s.url) is None  # as many as that, then the answer: performed


class _NoThreads(threading.Timer):
    def start(self) -> None:
        raise RuntimeError("can't start new thread")


def test_a_call_whose_deadline_timer_cannot_start_is_refused_not_unknown(monkeypatch):
    # Before, the timer's RuntimeError left the exchange before its "nothing sent" guard: the
    # call was taken for an unknown outcome -- parked `failed` for an operator where the intent
    # had no check_url, though nothing had been sent.
    monkeypatch.setattr(exchange.threading, "Timer", _NoThreads)
    with scripted_server(_final("200 OK")) as s:
        error = _perform(s.url)
        assert s.requests == []
    assert isinstance(error, Refused) and "nothing sent" in str(error), error


def test_interim_answers_are_read_past_without_http_clients_private_header_reader(monkeypatch):
    # Python 3.14's http.client._read_headers takes a second, required argument: the reader
    # called it with one, so every 103 or 102 answer was a TypeError (this stands in for 3.14).
    import http.client
    import sys

    own = http.client._read_headers  # type: ignore[attr-defined]

    def only_for_http_client(fp, *rest):  # type: ignore[no-untyped-def]
        caller = sys._getframe(1).f_globals["__name__"]
        if caller != "http.client":  # its signature is http.client's own business
            raise TypeError(f"_read_headers() called from {caller}")
        return own(fp, *rest)

    monkeypatch.setattr(http.client, "_read_headers", only_for_http_client)
    with scripted_server(HINTS + PROCESSING + _final("200 OK")) as s:
        assert _perform(s.url) is None


def test_an_interim_answer_with_too_many_headers_is_no_answer():
    many = b"HTTP/1.1 103 Early Hints\r\n" + b"Link: </a>\r\n" * 101 + b"\r\n"
    with scripted_server(many + _final("200 OK")) as s:
        error = _perform(s.url)
    assert isinstance(error, OutcomeUnknown) and "more than 100 headers" in str(error), error
