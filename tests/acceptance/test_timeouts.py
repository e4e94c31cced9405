"""A job that runs too long fails alone: its attempt fails with its own error, its worker process
is replaced, and every other worker keeps claiming. Real `qcluster`s; the overrunning handlers
block inside one C call that no signal interrupts (tests/app/handlers.py: `_stuck_in_c`)."""

import os
import signal

import pytest
from django.db import transaction

from jobs import enqueue
from jobs.models import Attempt, Job, RejectedWrite
from tests.acceptance.cluster import (
    wait_for_attempt,
    wait_for_outcome,
    wait_for_state,
    wait_until,
    worker_pid,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

# Q_TIMEOUT must stay above a drain's budget (jobs.E006) and below Q_RETRY (jobs.E002).
SHORT_Q_TIMEOUT = {"Q_TIMEOUT": "3", "Q_RETRY": "5", "JOBS_DRAIN_SECONDS": "1"}
QUICK_RETRY = {"JOBS_RETRY_BASE_SECONDS": "0.2"}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (exited, not yet reaped) is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def quick_jobs_all_succeed(count: int = 3, timeout: float = 15.0) -> None:
    quick = [enqueue("test.echo", {"n": n}) for n in range(count)]
    for job in quick:
        wait_for_state(job.pk, "succeeded", timeout=timeout)


def test_a_job_that_overruns_q_timeout_fails_alone_while_every_other_worker_keeps_claiming(
    start_qcluster,
):
    """Q_TIMEOUT = 3 s, a handler stuck 20 s in C code: at 3 s its attempt fails with its own
    error, its worker process ends (django-q2 replaces it), the main process logs it, the job is
    retried like any failure, and quick jobs enqueued afterwards run at once -- no shutdown grace
    was started (on main the guard's SIGTERM froze every drain of the cluster)."""
    cluster = start_qcluster(**SHORT_Q_TIMEOUT, **QUICK_RETRY)
    job = enqueue("test.stuck_in_c", {"seconds_by_attempt": {"1": 20, "2": 0}}, lease_seconds=60)
    first = wait_for_attempt(job.pk, 1)
    failed = wait_for_outcome(job.pk, 1, {"failed"}, timeout=3 + 8)
    assert "exceeded the task timeout of 3 s" in failed.error
    took = (failed.ended_at - first.claimed_at).total_seconds()
    assert 3 <= took < 3 + 4, f"failed {took:.1f} s after its claim"
    wait_until(
        lambda: gone(worker_pid(first.worker)),
        timeout=10,
        what="the timed-out worker process to end",
        job_id=job.pk,
    )
    quick_jobs_all_succeed()
    assert wait_for_state(job.pk, "succeeded", timeout=15).attempt == 2  # retried, then done
    wait_until(
        lambda: "django-q2 replaces the worker" in cluster.log(),
        timeout=5,
        what="the main process to log the timeout",
        job_id=job.pk,
    )
    wait_until(
        lambda: "reincarnated worker" in cluster.log(),  # django-q2's sentinel replaced it
        timeout=5,
        what="the worker to be replaced",
        job_id=job.pk,
    )
    assert "stopping:" not in cluster.log()  # no shutdown grace anywhere
    quick_jobs_all_succeed()  # still claiming, with the replacement worker


def test_a_kinds_own_timeout_fails_the_attempt_frees_the_worker_and_the_job_is_retried(
    start_qcluster,
):
    """@handler("test.timeout_in_c", timeout=1.5) under the default Q_TIMEOUT (1800 s)."""
    start_qcluster(**QUICK_RETRY)
    job = enqueue("test.timeout_in_c", {"seconds_by_attempt": {"1": 60, "2": 0}}, lease_seconds=60)
    first = wait_for_attempt(job.pk, 1)
    failed = wait_for_outcome(job.pk, 1, {"failed"}, timeout=1.5 + 8)
    assert "exceeded the task timeout of 1.5 s" in failed.error
    took = (failed.ended_at - first.claimed_at).total_seconds()
    assert 1.5 <= took < 1.5 + 4, f"failed {took:.1f} s after its claim"
    wait_until(
        lambda: gone(worker_pid(first.worker)),
        timeout=10,
        what="the timed-out worker process to end",
        job_id=job.pk,
    )
    done = wait_for_state(job.pk, "succeeded", timeout=15)
    assert done.attempt == 2
    assert Attempt.objects.get(job=job, number=2).worker != first.worker
    quick_jobs_all_succeed()


def test_a_kinds_timeout_above_q_timeout_and_q_retry_lets_an_overlong_job_finish_once(
    start_qcluster,
):
    """@handler("test.timeout_long", timeout=60, max_attempts=1) running 8 s under Q_TIMEOUT 3 s
    and Q_RETRY 5 s: the kind's own timeout applies, not Q_TIMEOUT (nothing fails it at 3 s, no
    watchdog kills it), its lease of 2 s is kept by the background heartbeat, django-q2's
    redelivery of its drain task after Q_RETRY claims nothing of it, and the other worker keeps
    running quick jobs meanwhile: one attempt, committed, nothing rejected."""
    cluster = start_qcluster(**SHORT_Q_TIMEOUT)
    job = enqueue("test.timeout_long", {"seconds": 8})
    first = wait_for_attempt(job.pk, 1)
    quick_jobs_all_succeed()  # the other worker claims while the long one runs
    done = wait_for_state(job.pk, "succeeded", timeout=8 + 15)
    assert done.attempt == 1
    attempt = Attempt.objects.get(job=job)
    assert attempt.outcome == "succeeded" and attempt.worker == first.worker
    assert (attempt.ended_at - first.claimed_at).total_seconds() >= 8
    assert not RejectedWrite.objects.filter(job=job).exists()
    assert "exceeded the task timeout" not in cluster.log()
    assert "killed" not in cluster.log() and "lease reclaimed" not in cluster.log()


def test_a_handler_holding_the_gil_past_its_timeout_is_killed_by_the_main_process(
    start_qcluster,
):
    """No thread of the worker can run while its handler holds the GIL in C code: the main
    process kills it, and the job's lease decides the attempt."""
    cluster = start_qcluster(**QUICK_RETRY)
    job = enqueue(
        "test.timeout_in_c",
        {"seconds_by_attempt": {"1": 120, "2": 0}, "holding_the_gil": True},
        lease_seconds=4,
    )
    first = wait_for_attempt(job.pk, 1)
    wait_until(
        lambda: gone(worker_pid(first.worker)),
        timeout=1.5 + 5 + 8,
        what="the stuck worker process to be killed",
        job_id=job.pk,
    )
    assert "does not answer" in cluster.log()
    assert wait_for_state(job.pk, "succeeded", timeout=20).attempt == 2
    assert Attempt.objects.get(job=job, number=1).outcome == "expired"
    quick_jobs_all_succeed()


def test_a_sigterm_to_one_worker_stops_that_worker_alone(start_qcluster):
    """An operator's (or a guard's) SIGTERM to one worker process: that worker finishes within
    its grace and leaves; the rest of the cluster keeps claiming (on main it started the
    cluster-wide grace and every drain stopped claiming)."""
    cluster = start_qcluster(JOBS_SHUTDOWN_GRACE_SECONDS="1", **QUICK_RETRY)
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": 60, "2": 0}}, lease_seconds=60)
    first = wait_for_attempt(job.pk, 1)
    cluster._signal(worker_pid(first.worker), signal.SIGTERM)
    wait_for_outcome(job.pk, 1, {"released"}, timeout=1 + 5)  # its own grace, then handed back
    assert wait_for_state(job.pk, "succeeded", timeout=10).attempt == 2
    quick_jobs_all_succeed()
    assert "stopping:" not in cluster.log()


def test_a_timeout_commits_its_batchs_successes_and_hands_the_unstarted_ones_back(
    start_qcluster,
):
    """One worker, claim batches growing while jobs are quick (1, 2, then 4): the batch of four
    holds a quick job, the overrunning one, and two behind it. The quick one's success is
    committed, the two go back uncharged (`released`) and run on the replacement worker, and
    only the overrunning attempt fails with the timeout."""
    start_qcluster(JOBS_WORKERS="1", JOBS_CLAIM_BATCH="8", **QUICK_RETRY)
    with transaction.atomic():  # one wake-up, so one drain finds them all, in this order
        warm = [enqueue("test.echo", {"n": n}) for n in range(3)]  # batches of 1, then 2
        done = enqueue("test.echo", {"n": 3})  # the batch of 4: this one,
        stuck = enqueue(  # the one that overruns,
            "test.timeout_in_c", {"seconds_by_attempt": {"1": 60, "2": 0}}, lease_seconds=60
        )
        behind = [enqueue("test.echo", {"behind": n}) for n in range(2)]  # and these two
    for job in [*warm, done]:
        wait_for_state(job.pk, "succeeded")
    first = wait_for_attempt(stuck.pk, 1)
    failed = wait_for_outcome(stuck.pk, 1, {"failed"}, timeout=1.5 + 8)
    assert "exceeded the task timeout of 1.5 s" in failed.error
    assert Attempt.objects.get(job=done, number=1).outcome == "succeeded"
    for job in behind:  # held by the same drain while the overrunning handler ran: handed back
        assert wait_for_outcome(job.pk, 1, {"released"}, timeout=10).worker == first.worker
        finished = wait_for_state(job.pk, "succeeded", timeout=20)
        assert (finished.attempt, finished.attempts_released) == (2, 1)  # uncharged
    assert wait_for_state(stuck.pk, "succeeded", timeout=20).attempt == 2  # retried, then done
    assert not Job.objects.exclude(state="succeeded").exists()
