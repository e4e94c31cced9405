"""A handler's exception is a hostile value: one whose str() raises (an AssertionError subclass
here, which the runner asks whether it is multiprocessing's "daemonic processes" refusal) fails
its own job; its batch-mates run. Before, the hint's str(exc) raised inside the runner's
classification: the drain ended, its batch handed back, and the job came back to do it again."""

import pytest

import jobs
from jobs import handler
from jobs.models import Job
from jobs.worker import runner

pytestmark = pytest.mark.django_db(transaction=True)


class _Unprintable(AssertionError):
    def __str__(self) -> str:
        raise RuntimeError("str() of this error raises")


@handler("test.unprintable_assertion")
def _raise_unprintable(ctx):  # type: ignore[no-untyped-def]
    raise _Unprintable()


def test_an_error_whose_str_raises_fails_its_own_job_only():
    bad = jobs.enqueue("test.unprintable_assertion", max_attempts=1, priority=5)
    good = [jobs.enqueue("test.echo", {"n": n}) for n in range(2)]
    runner.drain(budget_seconds=20)
    bad.refresh_from_db()
    assert bad.state == "failed" and "_Unprintable" in bad.error
    assert set(Job.objects.filter(pk__in=[j.pk for j in good]).values_list("state", flat=True)) == {
        "succeeded"
    }
