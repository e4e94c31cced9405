"""A kind whose handler lookup raises (a resolver whose import fails) fails its own jobs with
that error; its batch-mates run (jobs.worker.runner._Kinds). Before, the exception escaped
run_batch before any job was held: the whole claimed batch stayed `running` until the reaper
took it back, a lease later, and the bad kind's jobs went round again."""

import pytest

import jobs
from jobs.core import registry
from jobs.models import Job
from jobs.worker import runner

pytestmark = pytest.mark.django_db(transaction=True)


def _resolve(kind: str) -> None:
    if kind == "test.lookup_raises":
        raise ImportError("the module of test.lookup_raises cannot be imported")


@pytest.fixture
def raising_resolver():
    registry.add_resolver(_resolve)
    yield
    registry._resolvers.remove(_resolve)


def test_a_kind_whose_lookup_raises_fails_its_own_job_and_not_its_batch(raising_resolver):
    good = [jobs.enqueue("test.echo", {"n": n}) for n in range(3)]
    # a committed queued row is work, however it got there (enqueue refuses an unknown kind)
    bad = Job.objects.create(kind="test.lookup_raises", payload={}, max_attempts=1)
    runner.drain(budget_seconds=20)
    bad.refresh_from_db()
    assert bad.state == "failed"
    assert "cannot be imported" in bad.error
    assert set(Job.objects.filter(pk__in=[j.pk for j in good]).values_list("state", flat=True)) == {
        "succeeded"
    }
