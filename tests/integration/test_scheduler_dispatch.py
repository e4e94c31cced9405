"""The embedded scheduler sends drains only where none stand (docs/design.md, the idle wake-up).

With work due, a tick asks for as many drains as there are due jobs, at most one per worker, less
those already waiting in the broker. While idle it keeps one drain per worker standing: it asks
for the ones missing from the broker, and asks again a little before the standing ones give up
(0.9 of JOBS_IDLE_WAIT_SECONDS). The broker is a stand-in here (django-q2's own is not what
decides); the due count is the real one, on PostgreSQL.
"""

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection  # noqa: F401  (the skipif condition)
from django.db.models.functions import Now
from django.utils import timezone

import jobs
from jobs.core import transitions
from jobs.models import Job
from jobs.worker import bridge, scheduler

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="idle drains wait on LISTEN"),
]

WORKERS = 4


class Broker:
    """django-q2's broker as the scheduler sees it: drains asked for wait in it until a worker
    takes them (`taken`)."""

    def __init__(self) -> None:
        self.waiting = 0
        self.requests: list[tuple[int, Sequence[str] | None]] = []

    def taken(self) -> None:
        self.waiting = 0


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    fake = Broker()

    def request_drains(count: int, queues: Sequence[str] | None, broker: Any) -> None:
        assert broker is fake
        fake.requests.append((count, queues))
        fake.waiting += count

    def pending_drains(broker: Any) -> int:
        assert broker is fake
        return fake.waiting

    monkeypatch.setattr(bridge, "new_broker", lambda: fake)
    monkeypatch.setattr(bridge, "worker_count", lambda: WORKERS)
    monkeypatch.setattr(bridge, "pending_drains", pending_drains)
    monkeypatch.setattr(bridge, "request_drains", request_drains)
    return fake


def idle_wait(settings: Any, seconds: float) -> None:
    settings.JOBS = {**getattr(settings, "JOBS", {}), "IDLE_WAIT_SECONDS": seconds}


def requested(broker: Broker) -> list[int]:
    return [count for count, _ in broker.requests]


@pytest.mark.parametrize(("standing", "asked"), [(0, [WORKERS]), (1, [WORKERS - 1]), (WORKERS, [])])
def test_an_idle_scheduler_asks_only_for_the_drains_missing_from_one_per_worker(
    broker: Broker, standing: int, asked: list[int]
) -> None:
    broker.waiting = standing
    sched = scheduler.EmbeddedScheduler()
    sched.dispatch()
    assert requested(broker) == asked
    assert all(queues == sched.queues for _, queues in broker.requests)


def test_idle_drains_are_asked_for_again_a_little_before_the_standing_ones_give_up(
    broker: Broker, settings: Any
) -> None:
    idle_wait(settings, 2.0)
    sched = scheduler.EmbeddedScheduler()
    sched.dispatch()
    asked_at = time.monotonic()
    assert requested(broker) == [WORKERS]
    broker.taken()  # the workers run them: the broker is empty, the drains stand in the workers
    sched.dispatch()
    assert requested(broker) == [WORKERS], "asked again while the standing drains still wait"
    deadline = asked_at + 10
    while len(broker.requests) == 1:
        assert time.monotonic() < deadline, "the standing drains were never renewed"
        time.sleep(0.01)  # poll interval of a deadline-bound wait
        sched.dispatch()
    renewed_after = time.monotonic() - asked_at
    assert requested(broker) == [WORKERS, WORKERS]
    assert 0.9 * 2.0 <= renewed_after < 2.0, renewed_after


def test_with_no_idle_wait_an_idle_scheduler_sends_no_drain(broker: Broker, settings: Any) -> None:
    idle_wait(settings, 0.0)
    scheduler.EmbeddedScheduler().dispatch()
    assert broker.requests == []


def plant_due_but_deferred(priority: int = 0) -> Job:
    """A job enqueued far past the defer horizon (60 s) once its time has come with no claim run
    meanwhile: due, and still `deferred` -- out of the pick index, which only a promotion brings
    it into (the trigger decides `deferred` only when state or run_at is written)."""
    job = jobs.enqueue("test.echo", priority=priority, run_at=timezone.now() + timedelta(hours=1))
    assert Job.objects.get(pk=job.pk).deferred
    Job.objects.filter(pk=job.pk).update(run_at=Now() - timedelta(seconds=1))
    Job.objects.filter(pk=job.pk).update(deferred=True)  # no trigger: only `deferred` written
    return job


def test_with_no_idle_wait_the_ticks_bring_a_job_deferred_far_ahead_in_and_send_a_drain(
    broker: Broker, settings: Any
) -> None:
    """Only claims promoted deferred rows, and with JOBS_IDLE_WAIT_SECONDS = 0 no drain stands
    claiming on an idle cluster: the due count never saw such a job and no drain was ever sent
    for it (a job enqueued an hour ahead, or retried after a backoff past 60 s, waited for some
    other enqueue). A tick promotes as a claim does; the next one counts the job due."""
    idle_wait(settings, 0.0)
    job = plant_due_but_deferred()
    sched = scheduler.EmbeddedScheduler()
    sched.dispatch()
    sched.dispatch()
    assert not Job.objects.get(pk=job.pk).deferred
    assert requested(broker) == [1]


def test_while_every_worker_is_busy_the_ticks_bring_an_urgent_job_in_for_the_next_claim(
    broker: Broker,
) -> None:
    """Every worker in a long handler (the drains asked for wait in the broker): no claim runs,
    so none promoted a job scheduled ahead as it came near. The first claim after it was due
    promoted it in the same statement as its pick, which cannot see that (one snapshot), and
    took the backlog's lower-priority job instead: the urgent job waited behind it. A tick
    promotes it ahead of that claim."""
    jobs.enqueue("test.echo", priority=0)
    urgent = plant_due_but_deferred(priority=100)
    broker.waiting = WORKERS
    scheduler.EmbeddedScheduler().dispatch()
    (claimed,) = transitions.claim("host-a:1", limit=1, lease_seconds=30)
    assert claimed.fence.job_id == urgent.pk


@pytest.mark.parametrize(
    ("due", "standing", "asked"),
    [(2, 0, [2]), (2, 1, [1]), (2, 2, []), (10, 1, [WORKERS - 1]), (10, WORKERS, [])],
)
def test_with_work_due_a_tick_asks_for_a_drain_per_due_job_where_none_stands(
    broker: Broker, due: int, standing: int, asked: list[int]
) -> None:
    for _ in range(due):
        jobs.enqueue("test.echo")
    broker.waiting = standing
    sched = scheduler.EmbeddedScheduler()
    sched.dispatch()
    assert requested(broker) == asked
    sched.dispatch()  # the next tick: the drains it asked for still wait in the broker
    assert requested(broker) == asked
