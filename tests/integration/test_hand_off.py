"""Batching never holds a quick job behind a slow one: batch-mates waiting behind a handler that
runs past HANDOFF_SECONDS are handed back (fenced, uncharged), and a free worker takes them."""

import threading
import time

import pytest
from django.db import connections
from django.test import override_settings

from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job, JobEvent
from jobs.worker import runner, shutdown
from jobs.worker.heartbeat import HANDOFF_SECONDS

pytestmark = pytest.mark.django_db(transaction=True)
SLOW = 2.0


def drain_in_thread(results: dict[str, int], name: str) -> threading.Thread:
    def run() -> None:
        try:
            results[name] = runner.drain(budget_seconds=30.0, idle_wait=True)
        finally:
            connections.close_all()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@override_settings(JOBS={"POLL_SECONDS": 0.1, "IDLE_WAIT_SECONDS": 1.0, "CLAIM_BATCH": 8})
def test_quick_jobs_waiting_behind_a_slow_one_are_handed_to_a_free_worker():
    # claim order is id order: three quick jobs grow the claim batch (1, then 2), so the third
    # claim (of 4) takes the slow job with the three quick ones behind it
    warm = [Job.objects.create(kind="test.echo", payload={"n": i}) for i in range(3)]
    slow = Job.objects.create(kind="test.script", payload={"seconds": SLOW})
    quick = [Job.objects.create(kind="test.echo", payload={"n": i}) for i in range(3)]
    results: dict[str, int] = {}
    try:
        first = drain_in_thread(results, "first")
        deadline = time.monotonic() + 10
        while not Job.objects.filter(pk=slow.pk, state=JobState.RUNNING).exists():
            assert time.monotonic() < deadline, "the slow job was never claimed"
            time.sleep(0.005)
        second = drain_in_thread(results, "second")  # a free worker
        first.join(timeout=30)
        second.join(timeout=30)
    finally:
        shutdown.begin(0.0)
        shutdown.reset()
    assert not first.is_alive() and not second.is_alive()

    slow.refresh_from_db()
    for job in [*warm, *quick]:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED
    for job in quick:
        # done by the free worker while the slow handler still ran, not after it
        assert job.finished_at < slow.finished_at
        assert (job.finished_at - slow.updated_at).total_seconds() < SLOW
        released, done = Attempt.objects.filter(job=job).order_by("number")
        assert released.outcome == AttemptOutcome.RELEASED
        assert done.outcome == AttemptOutcome.SUCCEEDED
        assert (job.attempt, job.attempts_released) == (2, 1)  # the hand-back is not charged
        assert JobEvent.objects.filter(job=job, type="released", attempt=1).exists()
    # handed back soon after the slow handler started, not when it ended
    started = Attempt.objects.get(job=slow).claimed_at
    for job in quick:
        released = Attempt.objects.get(job=job, number=1)
        assert (released.ended_at - started).total_seconds() < HANDOFF_SECONDS + 1.0
    assert results["first"] + results["second"] == 7  # 3 warm + slow + 3 quick, each ran once


@override_settings(JOBS={"POLL_SECONDS": 0.1, "IDLE_WAIT_SECONDS": 0.0, "CLAIM_BATCH": 8})
def test_a_batch_of_quick_jobs_is_never_handed_back():
    jobs_ = [Job.objects.create(kind="test.echo", payload={"n": i}) for i in range(20)]
    assert runner.drain(budget_seconds=30.0) == 20
    for job in jobs_:
        job.refresh_from_db()
        assert (job.state, job.attempt, job.attempts_released) == (JobState.SUCCEEDED, 1, 0)
