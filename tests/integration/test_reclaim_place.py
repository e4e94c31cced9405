"""A job whose worker died before its handler was confirmed running keeps its place in the queue.

The reaper's uncharged reclaim (a batch-mate killed the worker, or the worker died between the
claim and the first beat) is a hand-back the worker could not make itself: like a release, the job
keeps its run_at and is claimed before jobs enqueued after it. A charged reclaim (its handler ran)
is due now, behind what is due already. Real claims, a real lease expiry on the database clock.
"""

import pytest
from django.db import connection

import jobs
from jobs.core import transitions
from jobs.models import Job
from jobs.worker import reaper
from tests.acceptance.cluster import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 0.5  # the shortest lease bounds allow


def _expired(job_id: int) -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT lease_expires_at < clock_timestamp() FROM jobs_job WHERE id = %s", [job_id]
        )
        return bool(cur.fetchone()[0])


@pytest.mark.parametrize("confirmed", [False, True], ids=["uncharged", "charged"])
def test_a_reclaimed_job_keeps_its_place_unless_its_handler_ran(confirmed: bool) -> None:
    first = jobs.enqueue("test.echo", max_attempts=5)
    (claimed,) = transitions.claim("host-a:1", limit=1, lease_seconds=LEASE)
    assert claimed.fence.job_id == first.pk
    if confirmed:
        transitions.confirm_running(claimed.fence)
    later = [jobs.enqueue("test.echo", max_attempts=5) for _ in range(3)]
    wait_until(lambda: _expired(first.pk), timeout=10, what="lease expired", job_id=first.pk)
    assert reaper.reap("reaper:1") == 1
    order = [c.fence.job_id for c in transitions.claim("host-b:2", limit=4, lease_seconds=30)]
    if confirmed:
        assert order == [j.pk for j in later] + [first.pk]
    else:
        assert order == [first.pk] + [j.pk for j in later]
    first.refresh_from_db()
    assert (first.attempt, first.attempts_released) == (2, 0 if confirmed else 1)
    assert Job.objects.filter(state="running").count() == 4
