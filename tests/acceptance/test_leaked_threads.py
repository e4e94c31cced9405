"""A handler that leaves a non-daemon thread running does not keep its worker process from
exiting (jobs.worker.shutdown).

django-q2 recycles a worker after `recycle` tasks (500 drains by default): the process leaves
its task loop and exits, and the sentinel replaces it once it is no longer alive. Python's exit
waits for every non-daemon thread first, so one a handler left running forever kept the
recycled worker alive and idle for good -- never replaced: the cluster had one worker fewer,
and none at all once each had met such a handler. Real qcluster, one worker, recycled after
two drains."""

import pytest

from jobs import enqueue
from jobs.worker import shutdown
from tests.acceptance.cluster import wait_for_state, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_a_worker_with_a_leaked_thread_is_recycled_and_the_cluster_keeps_working(start_qcluster):
    cluster = start_qcluster(
        JOBS_WORKERS="1", TEST_Q_RECYCLE="2", JOBS_DRAIN_SECONDS="0.5", JOBS_IDLE_WAIT_SECONDS="0.2"
    )
    leaking = enqueue("test.script", {"leak_thread": True})
    wait_for_state(leaking.pk, "succeeded")
    wait_until(
        lambda: "stopped doing work" in cluster.log(),
        timeout=20,
        what="django-q2 to end the worker's task loop (recycle)",
        job_id=leaking.pk,
    )
    after = [enqueue("test.echo", {"n": n}) for n in range(3)]
    for job in after:
        wait_for_state(job.pk, "succeeded", timeout=20)
    assert "thread(s) a handler left running: leaked-by-handler" in cluster.log()
    assert f"exits with status {shutdown.EXIT_LEAKED_THREADS}," in cluster.log()
