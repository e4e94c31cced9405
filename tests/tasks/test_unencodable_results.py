"""A task whose return value cannot be stored fails at once, not retried: every attempt would
return it again (Django's ImmediateBackend fails such a task once). Before, it was retried up to
max_attempts, each attempt ending the same way. Run by the runner, in this process."""

import pytest
from django.tasks import TaskResultStatus
from django.test import override_settings

from jobs.core import policy, transitions
from jobs.core.conf import jobs_settings
from jobs.models import Job
from jobs.tasks import UnencodableResult
from jobs.worker import completer, runner
from jobs.worker.heartbeat import Heartbeater
from tests.app import tasks

pytestmark = pytest.mark.django_db(transaction=True)

NO_BACKOFF = {"RETRY_BASE_SECONDS": 0.0}  # a retry would be due at once
CLASS_PATH = "jobs.tasks.execution.UnencodableResult"


def run_in_one_batch(results):
    """Claim the tasks' jobs in one batch, as a worker's drain does, and run it to its commit."""
    cfg = jobs_settings()
    with Heartbeater(policy.heartbeat_interval(cfg.LEASE_SECONDS, cfg), completer.commit) as beats:
        batch = transitions.claim(runner.worker_identity(), limit=len(results), lease_seconds=30)
        assert [c.fence.job_id for c in batch] == [int(r.id) for r in results]
        assert runner.run_batch(batch, beats) == len(results)
        beats.flush()


@override_settings(JOBS=NO_BACKOFF)
def test_an_unencodable_result_fails_its_task_once_and_its_batch_mates_commit():
    before = tasks.add.using(priority=10).enqueue(1, 2)
    bad = tasks.unjsonable.using(priority=5).enqueue()
    after = tasks.add.enqueue(3, 4)
    run_in_one_batch([before, bad, after])
    assert runner.drain() == 0  # nothing retried, though attempts remain and no backoff waits

    result = tasks.unjsonable.get_result(bad.id)  # Django's API, re-read from the job tables
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    assert result.attempts == 1 == Job.objects.get(pk=int(bad.id)).attempt
    assert tasks.unjsonable.max_attempts is None and jobs_settings().MAX_ATTEMPTS == 3  # left
    [error] = result.errors
    assert error.exception_class_path == CLASS_PATH
    assert error.exception_class is UnencodableResult
    assert error.traceback.splitlines()[-1] == (
        f"task raised {CLASS_PATH}: tests.app.tasks.unjsonable returned a value of type set, "
        "which cannot be encoded as its JSON result: Unsupported type: <class 'set'>"
    )
    for mate, value in ((before, 3), (after, 7)):
        mate.refresh()
        assert (mate.status, mate.return_value, mate.attempts) == (
            TaskResultStatus.SUCCESSFUL,
            value,
            1,
        )


@override_settings(JOBS=NO_BACKOFF)
@pytest.mark.parametrize(
    ("what", "why"),
    [
        (
            "set",
            "returned a value of type dict, which cannot be encoded as its JSON result: "
            "Unsupported type: <class 'set'>",
        ),
        (
            "object",
            "returned a value of type object, which cannot be encoded as its JSON result: "
            "Unsupported type: <class 'object'>",
        ),
        (
            "nan",
            "returned a value of type list, which cannot be encoded as its JSON result: "
            "the value is not JSON-serialisable: Out of range float values are not JSON compliant",
        ),
        ("bytes", "Unsupported value: <class 'bytes'>"),
        ("deep", "nested deeper than 64 levels"),
        ("recursion", "it is nested deeper than 64 levels (or holds a cycle)"),
        ("cycle", "it is nested deeper than 64 levels (or holds a cycle)"),
        ("large", "the value is 300002 bytes encoded; the limit is 262144"),
        # before: its RuntimeError was the task's own, retried up to max_attempts
        (
            "items_raise",
            "returned a value of type _RaisingItems, which cannot be encoded as its "
            "JSON result: RuntimeError: hostile items()",
        ),
        # before: stored with one of the two values gone
        ("colliding", "the value has the keys 1 and '1', which are the same key once stored"),
        ("colliding_bytes", "the value has the keys b'k' and 'k', which are the same key once"),
    ],
)
def test_every_sort_of_unstorable_result_fails_once_saying_why(what, why):
    result = tasks.unencodable.enqueue(what)
    runner.drain()
    runner.drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    [error] = result.errors
    assert error.exception_class_path == CLASS_PATH
    message = error.traceback.splitlines()[-1]
    assert message.startswith(f"task raised {CLASS_PATH}: tests.app.tasks.unencodable returned")
    assert why in message
    assert len(message) < 600  # bounded, however large the value


def test_a_task_that_raises_is_still_retried():
    """Only an unstorable result is permanent: the task's own exceptions are retried as before."""
    with override_settings(JOBS=NO_BACKOFF):
        result = tasks.flaky.enqueue(succeed_on=2)
        runner.drain()
    result.refresh()
    assert (result.status, result.attempts, result.return_value) == (
        TaskResultStatus.SUCCESSFUL,
        2,
        {"attempt": 2},
    )
