"""A job scheduled far ahead runs once due, in a real qcluster with no drain standing idle.

A queued row due more than the defer horizon (60 s) ahead is kept out of the pick index
(`deferred`) until something promotes it. Claims did, and only they: with
JOBS_IDLE_WAIT_SECONDS = 0 no drain stands claiming on an idle cluster, the scheduler's due count
never saw the row, and the job waited for some other enqueue to send a drain -- for ever on a
quiet cluster. The scheduler's ticks promote too now (jobs/core/sql/base.py, count_due).
"""

from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

import jobs
from jobs.models import Job
from tests.acceptance.cluster import wait_for_state

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_a_job_enqueued_past_the_defer_horizon_runs_when_due_with_no_standing_drains(
    start_qcluster,
):
    start_qcluster(JOBS_IDLE_WAIT_SECONDS="0")
    job = jobs.enqueue("test.echo", {"n": 1}, run_at=timezone.now() + timedelta(hours=1))
    assert Job.objects.get(pk=job.pk).deferred
    # Its hour has come (an hour's wait, planted): due, still deferred -- the trigger decides
    # `deferred` only when state or run_at is written, so the second UPDATE keeps it; one
    # transaction, so that no tick sees the row between the two.
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(run_at=Now() - timedelta(seconds=1))
        Job.objects.filter(pk=job.pk).update(deferred=True)
    done = wait_for_state(job.pk, "succeeded", timeout=20)
    assert done.attempt == 1
