"""A real `manage.py qcluster` on the embedded SQLite default, as `bin/run` starts it.

Two django-q2 workers and the embedded scheduler (polling: SQLite has no LISTEN) share one
database file with the test. The drain must run every job to its end exactly once -- successes,
a handler that fails until its attempts run out -- and a worker stopped past its lease must have
its late write refused, as on PostgreSQL.
"""

import pytest

from jobs import enqueue
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from tests.acceptance.cluster import (
    pause_first_attempt_until_reclaimed,
    wait_for_db_clock_past,
    wait_for_rejection,
    wait_for_state,
    wait_until,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_qcluster_drains_every_job_exactly_once_on_sqlite(start_qcluster):
    echoes = [enqueue("test.echo", {"n": n}) for n in range(40)]
    failing = enqueue("test.fail")  # its handler allows 2 attempts
    start_qcluster(JOBS_CLAIM_BATCH="8", JOBS_RETRY_BASE_SECONDS="0.1")

    wait_until(
        lambda: Job.objects.filter(state__in=["succeeded", "failed"]).count() == 41,
        timeout=60,
        what="every job to end",
        job_id=failing.pk,
    )
    for job in Job.objects.filter(pk__in=[e.pk for e in echoes]):
        assert (job.state, job.attempt) == ("succeeded", 1)
        assert job.result == {"echo": job.payload, "attempt": 1}
    failed = Job.objects.get(pk=failing.pk)
    assert (failed.state, failed.attempt) == ("failed", 2)
    assert failed.error.strip().endswith("RuntimeError: boom on attempt 2")
    assert list(JobEvent.objects.filter(job=failed).values_list("type", flat=True)) == [
        "enqueued",
        "claimed",
        "retry_scheduled",
        "claimed",
        "failed",
    ]
    assert Attempt.objects.count() == 42  # one claim per echo, two for the failing job
    assert not RejectedWrite.objects.exists()


def test_a_stopped_workers_late_write_is_refused_on_sqlite(start_qcluster):
    cluster = start_qcluster()
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": 1.5, "2": 0.2}})
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)
    committed = wait_for_state(job.pk, "succeeded")
    assert committed.attempt == 2
    wait_for_db_clock_past(job.pk, reclaimed.paused_at, 1.5)

    cluster.resume(reclaimed.zombie)

    # Its first stale write is its commit or, if its heartbeat thread beats first (opening a
    # SQLite connection is instant, unlike PostgreSQL's), its heartbeat: refused either way.
    rejected = wait_for_rejection(job.pk, 1, {"commit", "heartbeat"})
    assert (rejected.attempt_current, rejected.state_current) == (2, "succeeded")
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.attempt, after.result) == ("succeeded", 2, committed.result)
