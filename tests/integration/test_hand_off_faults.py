"""A failed hand-back never strands jobs: batch-mates waiting behind a slow handler stay held
(and beaten) until their hand-back succeeds, tried again with backoff."""

import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from jobs.core import transitions
from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job
from jobs.worker import completer, hand_back, runner, shutdown
from jobs.worker.heartbeat import Heartbeater
from tests.integration.pgproxy import PgProxy

pytestmark = pytest.mark.django_db(transaction=True)
SLOW = 4.0
# The fenced release's statement (jobs/core/sql): the proxy cuts the connection carrying it.
RELEASE_MARKER = b"attempts_released = attempts_released + 1"


@pytest.fixture
def proxied(settings) -> Iterator[PgProxy]:
    """Route Django's connections (every thread's) through the fault-injecting proxy."""
    settings.JOBS = {
        **settings.JOBS,
        "POLL_SECONDS": 0.1,
        "IDLE_WAIT_SECONDS": 1.0,
        "DB_TIMEOUT_SECONDS": 2.0,
    }
    db = connection.settings_dict
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    proxy = PgProxy(host, int(port))
    connection.close()
    db["HOST"], db["PORT"] = "127.0.0.1", proxy.port
    try:
        yield proxy
    finally:
        connection.close()
        db["HOST"], db["PORT"] = host, port
        proxy.close()


def in_thread(target) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_batch_mates_whose_hand_back_failed_stay_held_and_go_to_a_free_worker_promptly(proxied):
    slow = Job.objects.create(kind="test.script", payload={"seconds": SLOW})
    quick = [Job.objects.create(kind="test.echo", payload={"n": n}) for n in range(3)]
    batch = transitions.claim(runner.worker_identity(), limit=4, lease_seconds=30)
    assert [c.fence.job_id for c in batch] == [slow.pk, *(q.pk for q in quick)]
    # The first hand-back's connection is reset as the release goes out (before the server
    # sees it): that try fails, and nothing else will ever release these jobs but a retry.
    proxied.cut_on(RELEASE_MARKER, after_reply=False)

    def run_the_batch() -> None:
        with Heartbeater(1.0, completer.commit, on_hand_off=hand_back.waiting) as beats:
            runner.run_batch(batch, beats)

    started = time.monotonic()
    try:
        busy = in_thread(run_the_batch)
        free = in_thread(lambda: runner.drain(budget_seconds=SLOW + 5, idle_wait=True))
        busy.join(timeout=60)
        free.join(timeout=60)
    finally:
        shutdown.begin(0.0)
        shutdown.reset()
    assert not busy.is_alive() and not free.is_alive()
    assert proxied.cuts == 1, "the hand-back was never presented"

    slow.refresh_from_db()
    assert slow.state == JobState.SUCCEEDED
    for job in quick:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, f"job {job.pk} stranded: {job.state}"
        # done by the free worker while the slow handler still ran, not a lease later
        assert job.finished_at < slow.finished_at
        released, done = Attempt.objects.filter(job=job).order_by("number")
        assert released.outcome == AttemptOutcome.RELEASED
        assert done.outcome == AttemptOutcome.SUCCEEDED
        assert (job.attempt, job.attempts_released) == (2, 1)
    assert time.monotonic() - started < SLOW + 10
