"""Why the commit is fenced by attempt: a guard on state alone would accept a zombie's commit.

Real processes set the scene (a stopped worker still inside attempt 1 while attempt 2 runs on
another worker); a second connection then presents both forms of the commit statement inside a
transaction that is rolled back, so the running attempt is left untouched.
"""

import psycopg
import pytest

from jobs import enqueue
from jobs.models import Job
from tests.acceptance.cluster import pause_first_attempt_until_reclaimed

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

COMMIT = (
    "UPDATE jobs_job SET state = 'succeeded', result = '{\"zombie\": true}'::jsonb, "
    "lease_expires_at = NULL, finished_at = clock_timestamp(), updated_at = clock_timestamp() "
    "WHERE id = %s AND state = 'running'"
)
NAIVE = COMMIT
FENCED = COMMIT + " AND attempt = %s"


def test_state_only_guard_would_accept_a_zombie_commit_that_the_fence_rejects(
    start_qcluster, second_connection
):
    cluster = start_qcluster()
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": 1.5, "2": 3}})
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)
    assert Job.objects.filter(pk=job.pk, state="running", attempt=2).exists()

    with second_connection.transaction() as tx:
        fenced = second_connection.execute(FENCED, [job.pk, reclaimed.first.number]).rowcount
        naive = second_connection.execute(NAIVE, [job.pk]).rowcount
        raise psycopg.Rollback(tx)

    assert (fenced, naive) == (0, 1)
    assert Job.objects.filter(pk=job.pk, state="running", attempt=2, result__isnull=True).exists()
