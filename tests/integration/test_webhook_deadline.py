"""The webhook's total deadline covers the whole exchange: resolving the name, connecting to each
of its addresses, TLS, sending and the answer (jobs/effects/exchange.py).

Before, the timer that enforced it shut `conn.sock`, which is None until connect() returns:
a name whose addresses drop SYNs cost the timeout once per address, a timer firing during the
connect did nothing and never fired again, and from then on only the per-read timeout applied,
so a receiver trickling a byte every few seconds held a relay thread for ever (four such names
held all eight). Failing before anything was sent is `Refused` (safe to call again); from the
first byte on, a cut is `OutcomeUnknown`.

The addresses are real local sockets: one whose accept queue is full (the kernel drops every
SYN, so connect() hangs), a trickler, a receiver. Only the resolver is simulated (a hostile
name's DNS answer), by replacing socket.getaddrinfo.
"""

import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

import jobs
from jobs.effects import outbox, relay
from jobs.effects.webhook import OutcomeUnknown, Refused, WebhookTarget
from tests.integration.attempts import claim
from tests.receiver import receiver
from tests.slow_receivers import blackholed_address, trickling_server, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 1.0
TARGET = "test.deadline-webhook"
outbox.register_target(TARGET, WebhookTarget(timeout=DEADLINE))


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or 80


def _hostile_dns(monkeypatch: pytest.MonkeyPatch, *addresses: tuple[str, int]) -> None:
    """Every name ending in `.hostile.test` resolves to `addresses`, in that order."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(".hostile.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", a) for a in addresses]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def _timed(call: Callable[[], None], wait: float = 10.0) -> tuple[BaseException | None, float]:
    """Run `call` on a thread (so a call that never ends fails the test, not the run); what it
    raised and how long it took."""
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            call()
        except BaseException as exc:  # noqa: BLE001  handed to the test
            out["error"] = exc
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait)
    assert not thread.is_alive(), f"the call was still running after {wait} s"
    return out.get("error"), out["seconds"]


def _post(url: str) -> Callable[[], None]:
    return lambda: WebhookTarget(timeout=DEADLINE).perform("1:s", {"url": url, "json": {}}, 1)


def test_a_trickling_answer_is_cut_at_the_deadline_and_its_outcome_is_unknown():
    with trickling_server(byte_every=0.5) as t:  # each byte well within a per-read timeout
        error, seconds = _timed(_post(f"{t.url}/hook"))
    assert isinstance(error, OutcomeUnknown), error  # the request was sent: unknown
    assert f"no answer within {DEADLINE:g} s" in str(error)
    assert DEADLINE * 0.9 < seconds < DEADLINE + 0.5
    assert t.connections == 1


def test_a_name_whose_addresses_all_drop_syns_is_refused_at_the_deadline(monkeypatch):
    # Before: 5 s for a 1 s deadline (the timeout once per address).
    with blackholed_address() as black:
        _hostile_dns(monkeypatch, *[black] * 5)
        error, seconds = _timed(_post("http://five.hostile.test/hook"))
    assert seconds < DEADLINE + 0.5
    assert isinstance(error, Refused), error  # nothing was sent: safe to call again
    assert "nothing sent" in str(error)


def test_a_trickler_behind_an_address_that_drops_syns_is_cut_at_the_deadline(monkeypatch):
    # Before: the timer fired while connect() waited on the first address and did nothing; the
    # trickler, reached next, held the call for ever (still running after 10 s here).
    with blackholed_address() as black, trickling_server(byte_every=0.5) as t:
        _hostile_dns(monkeypatch, black, _address(t.url))
        error, seconds = _timed(_post("http://two.hostile.test/hook"))
    assert isinstance(error, OutcomeUnknown), error
    assert seconds < DEADLINE + 0.5
    assert t.connections == 1  # reached within the deadline, then cut


def test_a_receiver_whose_first_address_drops_syns_is_reached_at_its_next():
    # Each address gets a share of the time left, so one dead address does not eat the call.
    with blackholed_address() as black, receiver() as r:
        with pytest.MonkeyPatch.context() as mp:
            _hostile_dns(mp, black, _address(r.url))
            error, seconds = _timed(_post("http://mixed.hostile.test/hook"))
        assert error is None, error
        assert r.keys() == {"1:s"}
    assert seconds < DEADLINE * 0.75  # the first address's share, then an answer at once


def test_a_resolver_that_hangs_is_refused_at_the_deadline(monkeypatch):
    # Before: the call waited for the resolver, however long it took.
    answer = threading.Event()

    def getaddrinfo(*args: Any, **kwargs: Any) -> Any:
        answer.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "no answer")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    try:
        error, seconds = _timed(_post("http://slow-dns.hostile.test/hook"))
    finally:
        answer.set()
    assert isinstance(error, Refused), error
    assert "not resolved within" in str(error)
    assert seconds < DEADLINE + 0.5


def test_names_that_drop_syns_then_trickle_hold_the_relays_threads_only_until_the_deadline(
    monkeypatch,
):
    # Before: six such names took the relay's eight threads for ever (the probe: four names with
    # the 10 s deadline, ~55 h), and a healthy receiver's intent was never claimed.
    with (
        blackholed_address() as black,
        trickling_server(byte_every=0.5) as t,
        receiver() as healthy,
    ):
        _hostile_dns(monkeypatch, black, _address(t.url))
        job = jobs.enqueue("test.echo")
        running = claim("host-a:1")
        for n in range(12):  # two per name: each name is a lane of its own
            url = f"http://h{n // 2}.hostile.test/hook"
            running.ctx.intent(f"s{n}", TARGET, {"url": url, "json": {}})
        running.commit(None)
        pool = relay.Relay("relay-a")  # THREADS = 8, PER_LANE = 2
        try:
            pool.pump()
            assert sum(pool.in_flight().values()) == relay.THREADS
            job = jobs.enqueue("test.echo")
            running = claim("host-a:1")
            running.ctx.intent("ok", TARGET, {"url": f"{healthy.url}/hook", "json": {}})
            running.commit(None)
            committed = time.monotonic()
            while f"{job.pk}:ok" not in healthy.keys():
                assert time.monotonic() - committed < 10, "the healthy intent was never called"
                if not pool.pump():
                    pool.freed.wait(0.05)  # until a call ends, or the next look
            assert time.monotonic() - committed < DEADLINE + 1.0
        finally:
            t.stop.set()
            wait_for(lambda: not pool.in_flight(), 10, "a call outlived its deadline")


@pytest.mark.parametrize("method", ["perform", "reconcile"])
def test_an_answer_cut_after_its_status_line_is_no_answer(method):
    # The trickler's "HTTP/1.1 200 OK\r\n" arrives within the deadline, its headers never end.
    # Before: the cut read as an end of file, which ended the headers, and the 200 was taken
    # for an answer -- a call "performed", a check "found it performed" (the intent closed
    # reconciled on the word of a receiver that never answered).
    with trickling_server(byte_every=0.05) as t:
        data = {"url": f"{t.url}/hook", "check_url": f"{t.url}/check", "json": {}}
        target = WebhookTarget(timeout=DEADLINE)
        with pytest.raises(OutcomeUnknown, match=f"no answer within {DEADLINE:g} s"):
            getattr(target, method)("1:s", data, 2)
