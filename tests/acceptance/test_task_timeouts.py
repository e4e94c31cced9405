"""A `@task` whose attempt overruns its timeout, in a real qcluster: the failure that ends it is
announced (task_finished, FAILED) before its worker process ends -- within a bound, so a stuck
receiver cannot keep the process alive. The task lives in tests/tasks/cluster_tasks.py, run by a
cluster with tests.tasks installed; signals are read from the file the receivers there append to
in the qcluster processes (PALISADE_TEST_TASK_SIGNALS)."""

import time

import pytest
from django.tasks import TaskResultStatus

from jobs.tasks.execution import EXIT_WAIT_SECONDS
from tests.acceptance.cluster import wait_for_attempt, wait_for_outcome, wait_until, worker_pid
from tests.acceptance.test_timeouts import gone
from tests.tasks import cluster_tasks
from tests.tasks.test_acceptance import _signals

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

CLUSTER = {"DJANGO_SETTINGS_MODULE": "tests.tasks.cluster_settings"}
# A notice still queued is sent in milliseconds; this much slack covers a loaded machine.
EXIT_SLACK_SECONDS = 3.0


def test_a_timed_out_tasks_failure_is_announced_once_before_its_worker_ends(
    start_qcluster, tmp_path
):
    """@task(timeout=1, max_attempts=1) running 60 s: its attempt fails with the timeout, and the
    task_finished (FAILED) the fail queued is sent before the worker's os._exit -- which used to
    kill the notice thread first, so the notice was lost every time."""
    log = tmp_path / "signals.log"
    cluster = start_qcluster(**CLUSTER, PALISADE_TEST_TASK_SIGNALS=str(log))
    result = cluster_tasks.overrun.enqueue(60)
    job_id = int(result.id)
    first = wait_for_attempt(job_id, 1)
    failed = wait_for_outcome(job_id, 1, {"failed"}, timeout=1 + 8)
    assert "exceeded the task timeout of 1 s" in failed.error
    wait_until(
        lambda: gone(worker_pid(first.worker)),
        timeout=10,
        what="the timed-out worker process to end",
        job_id=job_id,
    )
    wait_until(  # whatever the notice thread was going to write is written by now
        lambda: "django-q2 replaces the worker" in cluster.log(),
        timeout=5,
        what="the main process to log the timeout",
        job_id=job_id,
    )
    heard = _signals(log, result.id)
    assert ("started", "RUNNING", 1) in heard  # the signal log's receivers run in this cluster
    assert [s for s in heard if s[0] == "finished"] == [("finished", "FAILED", 1)]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1


def test_a_stuck_task_finished_receiver_delays_a_timed_out_workers_exit_by_the_bound_only(
    start_qcluster, tmp_path
):
    """A task_finished receiver that never returns: the timed-out worker still ends, at most
    EXIT_WAIT_SECONDS after its failure was written, and says that notices were lost."""
    log = tmp_path / "signals.log"
    cluster = start_qcluster(
        **CLUSTER, PALISADE_TEST_TASK_SIGNALS=str(log), PALISADE_TEST_SLOW_FINISHED="stuck"
    )
    result = cluster_tasks.overrun.enqueue(60)
    job_id = int(result.id)
    first = wait_for_attempt(job_id, 1)
    wait_for_outcome(job_id, 1, {"failed"}, timeout=1 + 8)
    failed_seen = time.monotonic()
    wait_until(
        lambda: gone(worker_pid(first.worker)),
        timeout=EXIT_WAIT_SECONDS + EXIT_SLACK_SECONDS,
        what=f"the timed-out worker to end within {EXIT_WAIT_SECONDS} s despite a stuck receiver",
        job_id=job_id,
    )
    assert time.monotonic() - failed_seen < EXIT_WAIT_SECONDS + EXIT_SLACK_SECONDS
    assert ("holding", "FAILED", 1) in _signals(log, result.id)  # stuck in it
    assert f"process {worker_pid(first.worker)} ends with task_finished notices unsent" in (
        cluster.log()
    )
