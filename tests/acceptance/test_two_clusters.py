"""Two qcluster processes, each with its own embedded scheduler, draining one queue together."""

import time

import pytest
from django.db.models import Count

from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from tests.acceptance.cluster import POLL_SECONDS

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_two_schedulers_and_their_workers_run_each_job_exactly_once(start_qcluster):
    start_qcluster()
    start_qcluster()
    # bulk_create: rows that never went through enqueue() are work too (the trigger wakes both).
    Job.objects.bulk_create([Job(kind="test.echo", payload={"n": n}) for n in range(300)])

    deadline = time.monotonic() + 60
    while Job.objects.filter(state="succeeded").count() < 300:
        states = list(Job.objects.values("state").annotate(n=Count("id")))
        assert time.monotonic() < deadline, f"not all jobs succeeded: {states}"
        time.sleep(POLL_SECONDS)  # the poll interval of a deadline-bound wait
    assert set(Job.objects.values_list("attempt", flat=True)) == {1}
    assert Attempt.objects.count() == 300
    assert set(Attempt.objects.values_list("outcome", flat=True)) == {"succeeded"}
    per_job = JobEvent.objects.filter(type="succeeded").values("job").annotate(n=Count("id"))
    assert {row["n"] for row in per_job} == {1}
    assert not RejectedWrite.objects.exists()
