"""Operator actions against a real qcluster: a requeue fences the running worker out, a cancel
stops a running handler at its next beat."""

import time

import pytest
from django.contrib.auth.models import User

import jobs
from jobs.models import Attempt, Job, RejectedWrite
from jobs.ops import actions
from tests.acceptance.cluster import (
    QCluster,
    wait_for_attempt,
    wait_for_rejection,
    wait_for_state,
    wait_until,
    worker_pid,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def operator(transactional_db):
    return User.objects.create_superuser("ops", password="pw")


def test_requeue_of_a_running_job_rejects_that_workers_later_commit(start_qcluster, operator):
    # A 30 s lease and 10 s heartbeats: nothing but the requeue can take the job away in time.
    cluster: QCluster = start_qcluster(JOBS_LEASE_SECONDS="30", JOBS_HEARTBEAT_SECONDS="10")
    job = jobs.enqueue("test.sleep", {"seconds_by_attempt": {"1": 1.5, "2": 0}})
    first = wait_for_attempt(job.pk, 1, poll=0.01)
    zombie = worker_pid(first.worker)
    wait_until(lambda: cluster.sleeping(zombie), timeout=5, what="the handler", job_id=job.pk)
    cluster.pause(zombie)
    try:
        report = actions.apply("requeue", [job.pk], user=operator, via="test")
        assert [r.attempt for r in report.changed] == [1], report.summary()
        done = wait_for_state(job.pk, "succeeded", timeout=15)
        assert done.attempt == 2 and done.result["attempt"] == 2
        assert worker_pid(Attempt.objects.get(job=job, number=2).worker) != zombie
    finally:
        cluster.resume(zombie)
    rejected = wait_for_rejection(job.pk, 1, {"commit"})
    assert (rejected.attempt_current, rejected.worker) == (2, first.worker)
    job.refresh_from_db()
    assert (job.state, job.attempt, job.result["attempt"]) == ("succeeded", 2, 2)
    assert Attempt.objects.get(job=job, number=1).outcome == "requeued"


def test_cancel_stops_a_running_handler_at_its_next_beat(start_qcluster, operator):
    start_qcluster(JOBS_WORKERS="1")  # one worker: the next job runs only once it is free
    job = jobs.enqueue("test.checkpointing", {"seconds": 60})
    wait_until(
        lambda: Job.objects.filter(pk=job.pk, progress__step__gte=2).exists(),
        timeout=20,
        what="the handler to checkpoint",
        job_id=job.pk,
    )
    started = time.monotonic()
    report = actions.apply("cancel", [job.pk], user=operator, via="test")
    assert len(report.changed) == 1, report.summary()
    rejected = wait_for_rejection(job.pk, 1, {"checkpoint", "heartbeat"}, timeout=10)
    assert rejected.state_current == "cancelled"
    after = jobs.enqueue("test.echo", {"after": "cancel"})
    wait_for_state(after.pk, "succeeded", timeout=15)
    assert time.monotonic() - started < 15, "the cancelled handler kept its worker busy"
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert Attempt.objects.get(job=job, number=1).outcome == "cancelled"
    assert not RejectedWrite.objects.filter(job=job, write="commit").exists()
