"""A child process forked by a handler never acts for the worker it was forked from.

The child of an `os.fork()` inside a handler has the worker's whole stack, its drain and its
database connection (the same socket). One that left by `sys.exit()` -- where `os._exit()` was
meant -- raised SystemExit up through the drain, which failed the parent's running attempt and
handed its batch back, from the child, on the parent's socket; one that returned from the
handler committed or released jobs, claimed new ones and went on as a worker of its own. Now the
child ends at once, silently, as soon as it is back in the drain (jobs.worker.runner). Real
qcluster."""

import pytest

from jobs import enqueue
from jobs.models import RejectedWrite
from tests.acceptance.cluster import wait_for_state

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("how", ["exit", "return"])
def test_a_child_forked_by_a_handler_never_ends_the_parents_attempt(start_qcluster, how):
    start_qcluster(JOBS_WORKERS="1")
    job = enqueue("test.script", {"fork_child": how, "after_fork": 1.0, "return": {"parent": 1}})
    done = wait_for_state(job.pk, "succeeded", timeout=20)
    assert (done.attempt, done.result) == (1, {"parent": 1})
    assert not RejectedWrite.objects.filter(job_id=job.pk).exists()
    after = [enqueue("test.echo", {"n": n}) for n in range(3)]
    for other in after:
        wait_for_state(other.pk, "succeeded", timeout=15)


def test_a_handler_using_multiprocessing_fails_with_what_to_use_instead(start_qcluster):
    """django-q2's workers are daemonic processes, which multiprocessing refuses children: the
    handler's job fails alone, and its error says why and what works (jobs.worker.runner)."""
    start_qcluster(JOBS_WORKERS="1")
    jobs_ = [
        enqueue("test.script", {"multiprocessing": how}, max_attempts=1)
        for how in ("process", "pool")
    ]
    for job in jobs_:
        failed = wait_for_state(job.pk, "failed", timeout=20)
        assert "daemonic processes are not allowed to have children" in failed.error
        assert "Use subprocess" in failed.error and "jobs.enqueue" in failed.error
    wait_for_state(enqueue("test.echo").pk, "succeeded", timeout=15)
