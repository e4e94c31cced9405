"""A BaseException raised in the embedded relay's own code stays that intent's own failure.

A target's SystemExit (or another BaseException but a stop) comes out of targets.call as
TargetExited, an ordinary exception. The relay's own step -- marking the intent, renewing its
claim -- raised one past the call thread's last resort (`except Exception`): the thread ended
with it, nothing said which intent (a SystemExit went to threading.excepthook, which drops it
silently), and the row waited out its lease unexplained. It is now logged with its intent like
any other failure of that call; the row is left to its lease (then reconciled), the slot freed,
and the relay's other calls go on. KeyboardInterrupt and GeneratorExit still pass through.

The same in the thread that keeps the claims of calls still out once the relay has stopped
(Relay.keep_claims): one such exception from its renewal ended it, and every call still out then
lost its claim at its lease's end with the call able to land. It is logged and tried again.
"""

import logging
import threading
import time
from typing import Any

import pytest

import jobs
from jobs.effects import outbox, relay
from jobs.models import Intent
from tests.integration.attempts import claim, commit_webhook_intents
from tests.receiver import receiver

pytestmark = pytest.mark.django_db(transaction=True)


class _Hangs:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def perform(self, key: str, data: Any, token: int) -> None:
        self.started.set()
        self.release.wait(20)  # a target that hangs until the test lets it go


HANGS = _Hangs()
outbox.register_target("test.base-exception-hangs", HANGS)


class LibraryCancelled(BaseException):
    """A library's own BaseException (as trio's Cancelled or gevent's Timeout are)."""


def _plant(monkeypatch: Any, key: str, raised: BaseException) -> None:
    """`raised` from the relay's own mark of `key`'s intent, after its target performed."""
    done = outbox._done

    def failing_done(c: outbox.Claim, *args: Any, **kwargs: Any) -> bool:
        if c.key == key:
            raise raised
        return done(c, *args, **kwargs)

    monkeypatch.setattr(outbox, "_done", failing_done)


def _escaped(monkeypatch: Any) -> list[BaseException | None]:
    """What left a thread unhandled from now on (threading.excepthook's arguments)."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def _until_calls_end(pool: relay.Relay) -> None:
    deadline = time.monotonic() + 10
    while pool.in_flight():  # each call's thread frees its slot as it ends
        assert time.monotonic() < deadline, f"slots still taken: {pool.in_flight()}"
        pool.freed.wait(0.05)


@pytest.mark.parametrize("raised", [SystemExit(3), LibraryCancelled("cancelled")])
def test_a_base_exception_in_the_relays_own_step_stays_with_its_intent(monkeypatch, caplog, raised):
    escaped = _escaped(monkeypatch)
    with receiver() as r, caplog.at_level(logging.ERROR, logger="jobs.outbox"):
        failing, other = commit_webhook_intents(r.url, 2)
        _plant(monkeypatch, failing, raised)
        pool = relay.Relay("relay-base", threads=2, per_lane=2, reserved=0)
        assert pool.pump() == 2
        _until_calls_end(pool)
        assert r.verdicts(other) == ["performed"]  # the relay's other call went on
        named = [rec for rec in caplog.records if failing in rec.getMessage()]
    assert escaped == []  # the thread's last resort kept it
    assert named and named[0].exc_info and named[0].exc_info[1] is raised, caplog.text
    row = Intent.objects.get(key=failing)  # performed, not marked: left to its lease
    assert row.state == "performing" and row.outcome_unknown
    assert Intent.objects.get(key=other).state == "done"
    assert pool.slots.plan(False).limit == 2  # every slot back
    assert pool.pump() == 0  # still claimed: nobody performs it again meanwhile


def test_a_keyboard_interrupt_in_the_relays_own_step_still_propagates(monkeypatch, caplog):
    escaped = _escaped(monkeypatch)
    with receiver() as r, caplog.at_level(logging.ERROR, logger="jobs.outbox"):
        (key,) = commit_webhook_intents(r.url, 1)
        stop = KeyboardInterrupt()
        _plant(monkeypatch, key, stop)
        pool = relay.Relay("relay-stop", threads=1, per_lane=1, reserved=0)
        assert pool.pump() == 1
        _until_calls_end(pool)
    deadline = time.monotonic() + 5
    while not escaped:  # the thread ends just after freeing its slot
        assert time.monotonic() < deadline, "the KeyboardInterrupt was swallowed"
        time.sleep(0.01)
    assert escaped == [stop]
    assert not [rec for rec in caplog.records if key in rec.getMessage()], caplog.text
    assert pool.slots.plan(False).limit == 1  # its slot freed all the same


def test_a_base_exception_in_the_keepers_renewal_keeps_the_claims_of_calls_still_out(
    monkeypatch, caplog
):
    HANGS.release.clear()
    HANGS.started.clear()
    escaped = _escaped(monkeypatch)
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", "test.base-exception-hangs", {})
    running.commit(None)
    key = f"{job.pk}:publish"
    pool = relay.Relay("relay-keeper", lease_seconds=3.0, call_deadline=0.2)
    renewals: list[str] = []
    mind = pool._mind_overdue

    def first_fails() -> None:
        renewals.append("tried")
        if len(renewals) == 1:
            raise SystemExit(1)
        mind()

    try:
        with caplog.at_level(logging.ERROR, logger="jobs.outbox"):
            assert pool.pump() == 1
            assert HANGS.started.wait(10)
            first = Intent.objects.get(key=key).lease_expires_at  # perform's own renewal
            monkeypatch.setattr(pool, "_mind_overdue", first_fails)
            pool.keep_claims()  # the relay stopped: its keeper renews the claim from now on
            deadline = time.monotonic() + 5  # the lease (3 s) would run out within it
            while Intent.objects.get(key=key).lease_expires_at <= first:
                assert time.monotonic() < deadline, f"not renewed ({renewals}, {escaped})"
                time.sleep(0.05)
    finally:
        HANGS.release.set()
        _until_calls_end(pool)
    assert escaped == [] and "not renewed" in caplog.text
