"""Every qcluster database session killed mid-job (pg_terminate_backend): nothing is lost."""

import time

import pytest
from django.db import connection

from jobs import enqueue
from jobs.models import Attempt, RejectedWrite
from tests.acceptance.cluster import POLL_SECONDS, wait_for_attempt, wait_for_state

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def terminate_other_sessions() -> int:
    """Kill every session on the test database but this one: workers, heartbeat, scheduler."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cur.fetchone()[0])


def test_a_job_survives_its_workers_connection_being_killed(start_qcluster):
    cluster = start_qcluster()
    job = enqueue("test.sleep", {"seconds": 1.5})
    wait_for_attempt(job.pk, 1)
    # The handler is asleep with its claim's session open; kill that and every other session.
    deadline = time.monotonic() + 5
    while terminate_other_sessions() == 0:
        assert time.monotonic() < deadline, "the cluster had no session to kill"
        time.sleep(POLL_SECONDS)

    done = wait_for_state(job.pk, "succeeded", timeout=20)
    # The worker reconnected and committed attempt 1 itself: no reclaim, nothing rejected.
    assert done.attempt == 1
    assert done.result["attempt"] == 1
    assert Attempt.objects.get(job=job).outcome == "succeeded"
    assert not RejectedWrite.objects.exists()
    # ...through the unknown-outcome path: the commit failed with its session, was re-read.
    assert "connection lost during the final write" in cluster.log()


def test_the_scheduler_reconnects_and_keeps_dispatching(start_qcluster):
    start_qcluster()
    first = enqueue("test.echo", {"n": 1})
    wait_for_state(first.pk, "succeeded")
    assert terminate_other_sessions() > 0  # the scheduler's LISTEN session among them

    second = enqueue("test.echo", {"n": 2})
    assert wait_for_state(second.pk, "succeeded", timeout=20).attempt == 1
