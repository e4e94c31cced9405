"""@task functions against real `manage.py qcluster` processes: what django-tasks-db cannot do.

A task whose worker is SIGKILLed mid-run is reclaimed once its lease runs out and finishes on
another worker; a task whose worker is SIGSTOPped past its lease is reclaimed, and when the
stopped worker resumes its stale commit is rejected while `get_result()` reports the winner's
return value. The clusters resolve the tasks' kind from its module path (tests.app.tasks is
imported by nothing in the qcluster before the first claim). Signals are read from the file the
test receivers in tests/app/tasks.py (and tests/tasks/cluster_tasks.py) append to in the qcluster
processes.
"""

import os
import signal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.tasks import TaskResultStatus

from demo.tasks import drill as drill_task
from jobs.models import Attempt, Job, RejectedWrite
from jobs.tasks import LeaseExpired, UnencodableResult
from jobs.tasks.execution import EXIT_WAIT_SECONDS
from tests.acceptance.cluster import (
    pause_first_attempt_until_reclaimed,
    wait_for_attempt,
    wait_for_db_clock_past,
    wait_for_outcome,
    wait_for_rejection,
    wait_for_state,
    wait_until,
    worker_pid,
)
from tests.app import tasks
from tests.tasks import cluster_tasks

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FIRST_SECONDS = 1.5  # attempt 1's sleep: shorter than a lease, so it has run out when resumed


def _signals(path: Path, result_id: str) -> list[tuple[str, str, int]]:
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(name, status, int(n)) for name, rid, status, n in lines if rid == result_id]


def test_a_task_whose_worker_is_killed_is_reclaimed_and_finishes(start_qcluster, tmp_path):
    log = tmp_path / "signals.log"
    cluster = start_qcluster(PALISADE_TEST_TASK_SIGNALS=str(log))
    result = tasks.sleepy.enqueue(seconds_by_attempt={"1": 60})
    job_id = int(result.id)
    first = wait_for_attempt(job_id, 1)
    cluster.kill(worker_pid(first.worker))

    committed = wait_for_state(job_id, "succeeded")

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    last = Attempt.objects.get(job_id=job_id, number=committed.attempt)
    assert result.return_value == {"attempt": committed.attempt, "worker": last.worker}
    assert result.attempts == committed.attempt >= 2
    assert result.worker_ids[0] == first.worker and result.worker_ids[-1] == last.worker
    assert result.errors[0].exception_class is LeaseExpired
    assert result.started_at == first.claimed_at < result.last_attempted_at == last.claimed_at
    wait_until(
        lambda: ("finished", "SUCCESSFUL", committed.attempt) in _signals(log, result.id),
        timeout=10,
        what="task_finished from the worker that committed",
        job_id=job_id,
    )
    assert [s for s in _signals(log, result.id) if s[0] == "finished"] == [
        ("finished", "SUCCESSFUL", committed.attempt)
    ]


def test_a_stopped_workers_stale_commit_is_rejected_and_the_result_is_the_winners(
    start_qcluster, tmp_path
):
    log = tmp_path / "signals.log"
    cluster = start_qcluster(PALISADE_TEST_TASK_SIGNALS=str(log))
    result = tasks.sleepy.enqueue(seconds_by_attempt={"1": FIRST_SECONDS, "2": 0.2})
    job_id = int(result.id)
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job_id)

    wait_for_state(job_id, "succeeded")
    wait_for_db_clock_past(job_id, reclaimed.paused_at, FIRST_SECONDS)
    cluster.resume(reclaimed.zombie)

    rejected = wait_for_rejection(job_id, 1, {"commit"})
    assert (rejected.attempt_current, rejected.state_current) == (2, "succeeded")
    assert worker_pid(rejected.worker) == reclaimed.zombie

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 2, "worker": reclaimed.second.worker}
    assert result.worker_ids == [reclaimed.first.worker, reclaimed.second.worker]
    assert [e.exception_class for e in result.errors] == [LeaseExpired]
    assert RejectedWrite.objects.filter(job_id=job_id, attempt_presented=1).count() >= 1
    # Both attempts started; only the winner's commit was announced, never the zombie's.
    wait_until(
        lambda: ("finished", "SUCCESSFUL", 2) in _signals(log, result.id),
        timeout=10,
        what="task_finished of attempt 2",
        job_id=job_id,
    )
    heard = _signals(log, result.id)
    assert [s for s in heard if s[0] == "started"] == [
        ("started", "RUNNING", 1),
        ("started", "RUNNING", 2),
    ]
    assert [s for s in heard if s[0] == "finished"] == [("finished", "SUCCESSFUL", 2)]


def test_the_zombie_drill_works_on_a_task(start_qcluster):
    start_qcluster()
    out = StringIO()
    call_command("drill", "--task", "--timeout", "40", stdout=out)
    job = Job.objects.get(kind="demo.tasks.drill")
    assert (job.state, job.attempt) == ("succeeded", 2)
    refused = RejectedWrite.objects.get(job=job, attempt_presented=1)
    assert refused.attempt_current == 2
    result = drill_task.get_result(str(job.pk))
    second = Attempt.objects.get(job=job, number=2)
    assert result.return_value == {"attempt": 2, "worker": second.worker}
    assert f"job {job.pk}:" in out.getvalue() and "was rejected" in out.getvalue()


def _started(log: Path, result_id: str, job_id: int) -> None:
    """The task's function is called (task_started is sent just before): claimed is not enough,
    a claim handed back before its handler ran is no run of the task."""
    wait_until(
        lambda: ("started", "RUNNING", 1) in _signals(log, result_id),
        timeout=20,
        what="task_started of its first run",
        job_id=job_id,
    )


def test_a_running_task_is_handed_back_at_shutdown_and_finished_elsewhere(start_qcluster, tmp_path):
    """SIGTERM with a task running past the grace period: the attempt is handed back (fenced
    release, uncharged), another cluster finishes the task, and the hand-back is no error."""
    log = tmp_path / "signals.log"
    leaving = start_qcluster(JOBS_SHUTDOWN_GRACE_SECONDS="1", PALISADE_TEST_TASK_SIGNALS=str(log))
    result = tasks.sleepy.enqueue(seconds_by_attempt={"1": 60})
    job_id = int(result.id)
    first = wait_for_attempt(job_id, 1)
    _started(log, result.id, job_id)

    os.kill(leaving.proc.pid, signal.SIGTERM)
    wait_for_outcome(job_id, 1, {"released"}, timeout=15)
    start_qcluster()

    committed = wait_for_state(job_id, "succeeded", timeout=30)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["attempt"] == committed.attempt == result.attempts == 2
    assert result.worker_ids[0] == first.worker
    assert result.errors == []  # handed back unstarted-or-abandoned: not a failure of the task


def test_a_task_abandoned_at_shutdown_before_its_first_heartbeat_still_counts_as_run(
    start_qcluster, tmp_path
):
    """A grace shorter than the heartbeat interval: the abandoned handler ran, though no beat
    had confirmed it. The shutdown's hand-back beats first, so its released attempt reads as
    run (worker_ids, attempts, context.attempt). Before, it read as a claim handed back
    unstarted, and the next run was the task's attempt 1 again."""
    log = tmp_path / "signals.log"
    leaving = start_qcluster(
        JOBS_SHUTDOWN_GRACE_SECONDS="1",
        JOBS_HEARTBEAT_SECONDS="10",
        JOBS_LEASE_SECONDS="30",
        PALISADE_TEST_TASK_SIGNALS=str(log),
    )
    result = tasks.sleepy.enqueue(seconds_by_attempt={"1": 60})
    job_id = int(result.id)
    first = wait_for_attempt(job_id, 1)
    _started(log, result.id, job_id)
    os.kill(leaving.proc.pid, signal.SIGTERM)
    wait_for_outcome(job_id, 1, {"released"}, timeout=15)
    assert Attempt.objects.get(job_id=job_id, number=1).running_confirmed_at is not None
    result.refresh()
    assert (result.status, result.worker_ids, result.attempts) == (
        TaskResultStatus.READY,
        [first.worker],
        1,
    )


def test_a_task_whose_result_cannot_be_stored_fails_once_in_a_cluster(start_qcluster, tmp_path):
    """Its one attempt fails (UnencodableResult), with no retry though attempts remain; it is
    announced once, and the task enqueued beside it succeeds."""
    log = tmp_path / "signals.log"
    start_qcluster(PALISADE_TEST_TASK_SIGNALS=str(log))
    bad = tasks.unjsonable.enqueue()
    mate = tasks.add.enqueue(2, 2)
    wait_for_state(int(mate.id), "succeeded")
    wait_for_state(int(bad.id), "failed", timeout=30)  # retried, it would fail at attempt 3
    result = tasks.unjsonable.get_result(bad.id)
    assert (result.status, result.attempts, len(result.errors)) == (TaskResultStatus.FAILED, 1, 1)
    assert result.errors[0].exception_class is UnencodableResult
    assert "returned a value of type set" in result.errors[0].traceback
    mate.refresh()
    assert (mate.status, mate.return_value) == (TaskResultStatus.SUCCESSFUL, 4)
    wait_until(
        lambda: ("finished", "FAILED", 1) in _signals(log, bad.id),
        timeout=10,
        what="task_finished of the failed task",
        job_id=int(bad.id),
    )
    assert [s for s in _signals(log, bad.id) if s[0] == "finished"] == [("finished", "FAILED", 1)]


def _a_notice_held(start_qcluster, tmp_path, mode: str):  # type: ignore[no-untyped-def]
    """A cluster whose task_finished receiver holds (PALISADE_TEST_SLOW_FINISHED=`mode`) the
    notice of a task that succeeded: (cluster, its signal log, the task's result)."""
    log = tmp_path / "signals.log"
    cluster = start_qcluster(
        DJANGO_SETTINGS_MODULE="tests.tasks.cluster_settings",
        PALISADE_TEST_TASK_SIGNALS=str(log),
        PALISADE_TEST_SLOW_FINISHED=mode,
    )
    result = cluster_tasks.quick.enqueue(7)
    wait_until(
        lambda: ("holding", "SUCCESSFUL", 1) in _signals(log, result.id),
        timeout=20,
        what=f"the task_finished receiver to hold the notice ({mode})",
        job_id=int(result.id),
    )
    return cluster, log, result


def test_a_task_finished_still_being_sent_when_a_worker_stops_is_sent_before_it_exits(
    start_qcluster, tmp_path
):
    """The notice thread is daemonic: a worker that stopped normally used to end with it, and a
    task_finished still being sent was lost. Its receiver here holds the notice until the worker
    process is ending (its main thread is over), then completes it: the process waits for it
    (at most jobs.tasks' EXIT_WAIT_SECONDS)."""
    cluster, log, result = _a_notice_held(start_qcluster, tmp_path, "until-exit")
    cluster.shutdown()  # SIGTERM; returns once every process of the cluster is gone
    assert [s for s in _signals(log, result.id) if s[0] == "held"] == [("held", "SUCCESSFUL", 1)]
    assert "cluster processes still running" not in cluster.log()  # it ended on its own


def test_a_stuck_task_finished_receiver_delays_a_workers_stop_by_the_bound_only(
    start_qcluster, tmp_path
):
    """A receiver that never returns: the stopping worker gives up on it after the bound, says
    so, and ends on its own (killed instead, it could not have logged it)."""
    cluster, log, result = _a_notice_held(start_qcluster, tmp_path, "stuck")
    cluster.shutdown()  # SIGTERM; SIGKILL of the group if it is not gone within 5 s
    assert f"ends with task_finished notices unsent after {EXIT_WAIT_SECONDS:g} s" in cluster.log()
