"""A real qcluster worker whose handler leaves a transaction open keeps committing other jobs.

The worker process lives on after the job (django-q2 reuses it for drain after drain), and so
does its database connection: a handler that returned inside a hand-entered atomic block made
every later drain of that worker raise, and one that left a raw BEGIN open took the worker's
next claims and commits into a transaction never committed (jobs.worker.hygiene).
"""

import pytest

from jobs import enqueue
from jobs.models import Job
from tests.acceptance.cluster import wait_for_state, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("leave", ["atomic", "begin"])
def test_a_worker_whose_handler_left_a_transaction_open_goes_on_committing(start_qcluster, leave):
    start_qcluster(JOBS_WORKERS="1")  # one worker process: every job below runs in it
    leaving = enqueue("test.script", {"leave": leave}, max_attempts=1)
    wait_until(
        lambda: Job.objects.filter(pk=leaving.pk, attempt=1).exclude(state="running").exists(),
        timeout=20,
        what="the leaving handler's attempt to end",
        job_id=leaving.pk,
    )
    after = [enqueue("test.echo", {"n": n}) for n in range(3)]
    for job in after:
        wait_for_state(job.pk, "succeeded", timeout=15)
    leaving.refresh_from_db()
    assert leaving.state == "failed" and "rolled back" in leaving.error
    wait_until(
        lambda: not Job.objects.filter(state="running").exists(),
        timeout=5,
        what="no job left running",
        job_id=leaving.pk,
    )


def test_session_state_a_handler_left_is_gone_for_the_workers_next_job(start_qcluster):
    """SET statement_timeout / search_path, set_config, an advisory lock, a temporary table,
    timezone.activate and translation.activate, all left by one job: the next job of the same
    worker process finds its session as the job before that one did."""
    from tests.app.handlers import SESSION_CHANGES

    start_qcluster(JOBS_WORKERS="1")
    before = enqueue("test.session", priority=10)
    change = [*SESSION_CHANGES, "timezone", "language"]
    leaving = enqueue("test.session", {"change": change}, priority=5)
    after = enqueue("test.session")
    for job in (before, leaving, after):
        wait_for_state(job.pk, "succeeded", timeout=20)
    before.refresh_from_db()
    after.refresh_from_db()
    assert after.result == before.result
    assert after.result["advisory_locks"] == 0 and not after.result["temp_table"]
