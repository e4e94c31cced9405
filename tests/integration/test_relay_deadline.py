"""The relay gives up on any target's call at its own deadline, whatever the target.

A registered target (register_target) had no deadline but its own: a call that hung held its
relay thread for as long as it hung -- one such target per thread and the relay delivered
nothing, to any receiver, for good -- and a call slower than the 60 s relay lease had its intent
claimed again while still in flight. Now the relay hands such an intent back at CALL_DEADLINE as
an unknown outcome (fenced by its own token, inside its lease) and frees the thread slot; the
call's thread runs on, still counted in its lane, and its late marks change nothing.
"""

import threading
import time
from typing import Any

import pytest
from django.db.models.functions import Now

import jobs
from jobs.effects import relay
from jobs.effects.outbox import register_target
from jobs.models import Intent
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)


class _Hangs:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def perform(self, key: str, data: Any, token: int) -> None:
        self.calls += 1
        self.release.wait(20)  # a target that hangs until the test lets it go


class _Quick:
    def __init__(self) -> None:
        self.keys: list[str] = []

    def perform(self, key: str, data: Any, token: int) -> None:
        self.keys.append(key)


def _commit_intent(target: str) -> str:
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", target, {})
    running.commit(None)
    return f"{job.pk}:publish"


def _pump_until(pool: relay.Relay, done: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        Intent.objects.filter(state="pending").update(next_try_at=Now())  # its backoff: now
        if not pool.pump():
            pool.freed.wait(0.05)


def test_a_hanging_targets_call_is_given_up_at_the_deadline_and_frees_its_thread():
    hangs, quick = _Hangs(), _Quick()
    register_target("test.hangs", hangs)
    register_target("test.quick", quick)
    hung = _commit_intent("test.hangs")
    other = _commit_intent("test.quick")
    pool = relay.Relay("relay-deadline", threads=1, per_lane=1, reserved=0, call_deadline=0.5)
    try:
        # One thread, taken by the hanging call: before, the other intent waited for good.
        _pump_until(pool, lambda: quick.keys == [other], 10, "the hanging call kept the thread")
        row = Intent.objects.get(key=hung)
        assert (row.state, row.outcome_unknown, row.performs) == ("pending", True, 1)
        assert "deadline" in row.last_error
        # Its call is still out: the lane stays full, so it is not called a second time.
        _pump_until(pool, lambda: pool.in_flight() == {"test.hangs": 1}, 5, "its lane was freed")
        assert hangs.calls == 1
    finally:
        hangs.release.set()
    deadline = time.monotonic() + 10
    while pool.in_flight():
        assert time.monotonic() < deadline, f"slots still taken: {pool.in_flight()}"
        pool.freed.wait(0.05)
    row = Intent.objects.get(key=hung)
    assert (row.state, row.outcome_unknown) == ("pending", True)  # its late return marked nothing
    assert pool.slots.plan(False).limit == 1  # the thread is back
