"""Zombie workers against real `manage.py qcluster` processes on PostgreSQL.

Each test starts a qcluster with two django-q2 workers and two-second leases (cluster.py), then
stops, resumes or kills the worker process named by an Attempt row ("<hostname>:<pid>") and waits
on database conditions with deadlines.

Why a resumed zombie's first stale write is its commit: it is stopped inside `test.sleep`, before
its first background heartbeat, and resumed once that sleep has run out; so its handler returns at
once and the runner, which releases the job from the background heartbeat before committing,
presents the commit while the heartbeat thread is still opening its first database connection
(see pause_first_attempt_until_reclaimed). Whatever that thread presents afterwards (a stale
heartbeat, recorded or ignored) changes nothing asserted here.
"""

from datetime import timedelta

import pytest

from jobs import enqueue
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from tests.acceptance.cluster import (
    LEASE_SECONDS,
    pause_first_attempt_until_reclaimed,
    wait_for_attempt,
    wait_for_db_clock_past,
    wait_for_outcome,
    wait_for_rejection,
    wait_for_state,
    wait_until,
    worker_pid,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FIRST_SECONDS = 1.5  # attempt 1's sleep: shorter than a lease, so it has run out when resumed


def test_zombie_commit_is_rejected_after_another_worker_committed(start_qcluster):
    cluster = start_qcluster()
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": FIRST_SECONDS, "2": 0.2}})
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)

    committed = wait_for_state(job.pk, "succeeded")
    assert committed.attempt == 2
    assert committed.result == {"attempt": 2, "worker": reclaimed.second.worker}
    wait_for_db_clock_past(job.pk, reclaimed.paused_at, FIRST_SECONDS)

    cluster.resume(reclaimed.zombie)

    rejected = wait_for_rejection(job.pk, 1, {"commit"})
    assert (rejected.attempt_current, rejected.state_current) == (2, "succeeded")
    assert worker_pid(rejected.worker) == reclaimed.zombie
    # The attempt keeps what happened to it first: expired at T1, its commit rejected at T2.
    first = Attempt.objects.get(job=job, number=1)
    assert first.outcome == "expired" and first.ended_at < rejected.at
    # The zombie's commit changed zero rows: the job is exactly as attempt 2 left it.
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.attempt, after.result, after.finished_at) == (
        "succeeded",
        2,
        {"attempt": 2, "worker": reclaimed.second.worker},
        committed.finished_at,
    )
    assert Attempt.objects.get(job=job, number=2).outcome == "succeeded"
    assert list(
        JobEvent.objects.filter(job=job, type="succeeded").values_list("attempt", flat=True)
    ) == [2]


def test_zombie_commit_is_rejected_while_the_new_attempt_is_still_running(start_qcluster):
    cluster = start_qcluster()
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": FIRST_SECONDS, "2": 4}})
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)
    wait_for_db_clock_past(job.pk, reclaimed.paused_at, FIRST_SECONDS)

    cluster.resume(reclaimed.zombie)

    rejected = wait_for_rejection(job.pk, 1, {"commit"})
    # Rejected while the job was running again (under attempt 2): a guard on state alone
    # (`WHERE state = 'running'`) would have let this commit through.
    assert (rejected.attempt_current, rejected.state_current) == (2, "running")
    # The attempt keeps what happened to it first: expired at T1, its commit rejected at T2.
    first = Attempt.objects.get(job=job, number=1)
    assert first.outcome == "expired" and first.ended_at < rejected.at
    assert Job.objects.filter(pk=job.pk, state="running", attempt=2).exists()

    committed = wait_for_state(job.pk, "succeeded")
    assert committed.attempt == 2
    assert committed.result == {"attempt": 2, "worker": reclaimed.second.worker}
    assert Attempt.objects.get(job=job, number=2).outcome == "succeeded"
    assert rejected.at < committed.finished_at


def test_killed_worker_job_is_reclaimed_at_once_and_completes(start_qcluster):
    cluster = start_qcluster()
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": 60}, "seconds": 0.2})
    first = wait_for_attempt(job.pk, 1)
    cluster.kill(worker_pid(first.worker))

    committed = wait_for_state(job.pk, "succeeded")

    first = Attempt.objects.get(pk=first.pk)
    assert first.outcome == "expired"
    # Reclaimed as soon as qcluster's main process saw the worker die (jobs.worker.rescue), not
    # once the lease its last heartbeat set had run out (both database clock).
    assert first.ended_at - first.heartbeat_at < timedelta(seconds=LEASE_SECONDS)
    assert committed.attempt >= 2
    last = Attempt.objects.get(job=job, number=committed.attempt)
    assert last.outcome == "succeeded"
    assert worker_pid(last.worker) != worker_pid(first.worker)
    assert committed.result == {"attempt": committed.attempt, "worker": last.worker}
    # A dead process writes nothing, so nothing of attempt 1 was rejected.
    assert not RejectedWrite.objects.filter(job=job, attempt_presented=1).exists()


def test_lost_lease_stops_the_handler_before_it_commits(start_qcluster, second_connection):
    duration = 30.0
    start_qcluster()
    job = enqueue("test.checkpointing", {"seconds_by_attempt": {"1": duration}, "seconds": 0.2})
    first = wait_for_attempt(job.pk, 1)
    wait_for_checkpoint(job.pk)

    # Another claimant takes the job from a second connection: attempt 2, with a short lease
    # that nobody renews, so the reaper hands it on to attempt 3 afterwards.
    with second_connection.transaction():
        row = second_connection.execute(
            "UPDATE jobs_job SET attempt = attempt + 1, heartbeat_at = clock_timestamp(), "
            "lease_expires_at = clock_timestamp() + make_interval(secs => 1), "
            "updated_at = clock_timestamp() "
            "WHERE id = %s AND attempt = 1 AND state = 'running' RETURNING clock_timestamp()",
            [job.pk],
        ).fetchone()
        assert row is not None, "attempt 1 ended before its lease could be taken away"
        second_connection.execute(
            "INSERT INTO jobs_attempt "
            "(job_id, number, worker, claimed_at, heartbeat_at, outcome, staging_ref, error) "
            "VALUES (%s, 2, 'acceptance-claimant:0', clock_timestamp(), clock_timestamp(), "
            "'running', '', '')",
            [job.pk],
        )
    taken_at = row[0]

    lost = wait_for_outcome(job.pk, 1, {"lost", "rejected", "succeeded", "failed"})
    assert lost.outcome == "lost"
    rejected = wait_for_rejection(job.pk, 1, {"heartbeat", "checkpoint"})
    assert rejected.attempt_current >= 2
    # The handler stopped within moments of the lease going, not after its 30 s of work.
    assert lost.ended_at - taken_at < timedelta(seconds=5)
    assert lost.ended_at - first.claimed_at < timedelta(seconds=duration / 2)

    committed = wait_for_state(job.pk, "succeeded")
    assert committed.attempt == 3
    assert committed.result["attempt"] == 3
    assert not RejectedWrite.objects.filter(job=job, attempt_presented=1, write="commit").exists()
    assert not JobEvent.objects.filter(job=job, attempt=1, type="succeeded").exists()


def wait_for_checkpoint(job_id: int) -> None:
    """Attempt 1's handler is alive: it has checkpointed at least once."""
    wait_until(
        lambda: Job.objects.filter(pk=job_id, attempt=1, progress__isnull=False).exists(),
        timeout=20,
        what="attempt 1 to checkpoint",
        job_id=job_id,
    )
