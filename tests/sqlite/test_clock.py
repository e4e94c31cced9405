"""SQLite's clock arithmetic: the host clock as UTC text, any number of seconds added to it."""

import datetime as dt

import pytest

from jobs.core import transitions
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.models import Job
from tests.conftest import database_now

pytestmark = pytest.mark.django_db
WORKER = "host-a:1"


@pytest.mark.parametrize("retry_in", [1e-05, 0.0, 3600.0])
def test_a_retry_due_in_any_number_of_seconds_is_queued_at_that_time(make_job, retry_in):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER)
    before = database_now()
    transitions.fail(Fence(job.pk, 1, WORKER), "boom", retry_in)
    after = database_now()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    slack = dt.timedelta(milliseconds=1)  # SQLite's clock counts milliseconds
    delay = dt.timedelta(seconds=retry_in)
    assert before + delay - slack <= job.run_at <= after + delay + slack


def test_an_expired_lease_planted_in_the_past_is_in_the_past(make_job):
    """A negative number of seconds: '+-5.0 seconds' was no SQLite modifier, and gave NULL."""
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-5)
    assert job.lease_expires_at is not None
    assert job.lease_expires_at < database_now() - dt.timedelta(seconds=4)
    assert list(Job.objects.expired_leases()) == [job]
