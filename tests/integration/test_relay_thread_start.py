"""A relay call whose thread cannot start stays that intent's own failure.

Before, `Relay.pump()` reserved the call's slot, then `Thread.start()` raised (RuntimeError
"can't start new thread": the process at its thread limit, or out of memory): the slot was
never released -- the relay had one call fewer for good, and a lane's slots could all be lost
that way -- the exception left pump(), so the batch's later claims were never started either,
and every one of them waited out its 60 s relay lease. Now the slot is released, that intent is
handed back with backoff (nothing was sent: not an unknown outcome), and the others' calls start.
"""

import threading
import time
from typing import Any

import pytest
from django.db.models.functions import Now

from jobs.effects import relay
from jobs.models import Intent
from tests.integration.attempts import commit_webhook_intents
from tests.receiver import receiver

pytestmark = pytest.mark.django_db(transaction=True)


class _FirstStartFails(threading.Thread):
    """A thread whose first start() of a relay call fails as at the process's thread limit."""

    failed: list[str] = []

    def start(self) -> None:
        if self.name.startswith("jobs-relay-") and not _FirstStartFails.failed:
            _FirstStartFails.failed.append(self.name)
            raise RuntimeError("can't start new thread")
        super().start()


def _pump_until(pool: relay.Relay, done: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        Intent.objects.filter(state="pending").update(next_try_at=Now())  # its backoff: now
        if not pool.pump():
            pool.freed.wait(0.05)  # until a call ends, or the next look


def test_a_call_thread_that_cannot_start_frees_its_slot_and_stops_no_other_delivery(
    monkeypatch,
):
    _FirstStartFails.failed = []
    monkeypatch.setattr(relay.threading, "Thread", _FirstStartFails)
    with receiver() as r:
        keys = commit_webhook_intents(r.url, 3)
        pool = relay.Relay("relay-threads", threads=3, per_lane=3, reserved=0)
        started = pool.pump()  # raised before, with the slot taken and two claims left idle
        assert _FirstStartFails.failed and started == 2
        failed = Intent.objects.get(state="pending")
        assert failed.performs == 0 and not failed.outcome_unknown  # nothing was sent
        assert "can't start new thread" in failed.last_error

        _pump_until(
            pool,
            lambda: not Intent.objects.exclude(state="done").exists(),
            10,
            "an intent was never delivered",
        )
        assert all(r.verdicts(k) == ["performed"] for k in keys)
        deadline = time.monotonic() + 5
        while pool.in_flight():  # each call's thread frees its slot as it ends
            assert time.monotonic() < deadline, f"slots still taken: {pool.in_flight()}"
            pool.freed.wait(0.05)
        assert pool.slots.plan(False).limit == 3  # every slot back
