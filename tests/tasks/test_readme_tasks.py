"""Two promises of docs/tasks.md that had no test of their own.

- Signals, "Not sent: ... for an operator's cancel or requeue": the job ends (or starts over)
  by an operator's hand, not by a worker's final write, so `task_finished` is not sent for it;
  the worker's later commit is rejected and announces nothing either. A requeued task that then
  runs to its end is announced once, by that run.
- Unique keys, "a key function may return `None` (no key)": each such enqueue is a job of its own.
"""

from collections.abc import Iterator

import pytest
from django.tasks import task
from django.tasks.signals import task_finished

from jobs.core import transitions
from jobs.core.registry import get_handler
from jobs.models import Job, RejectedWrite
from jobs.tasks.execution import wait_for_finished_notices
from jobs.worker import runner
from tests.app import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@task(unique_key=lambda args, kwargs: kwargs.get("key"))
def keyed_when_asked(*, key: str | None = None) -> None:
    """Enqueued only (never run: this module is in no installed app)."""


@pytest.fixture
def finished() -> Iterator[list[tuple[str, str]]]:
    """(job id, status) of every task_finished this process sends during the test."""
    heard: list[tuple[str, str]] = []

    def receiver(sender, task_result, **kwargs):
        heard.append((task_result.id, task_result.status))

    task_finished.connect(receiver, weak=False)
    yield heard
    task_finished.disconnect(receiver)


@pytest.mark.parametrize("operator_action", [transitions.cancel, transitions.requeue])
def test_an_operators_cancel_or_requeue_of_a_running_task_sends_no_task_finished(
    finished, swap_handler, operator_action
):
    result = tasks.add.enqueue(1, 2)
    real = get_handler(tasks.add.module_path).fn
    acted: list[bool] = []

    def taken_back_while_running(ctx):
        if not acted:  # the first attempt only: a requeued task runs again, to its end
            acted.append(operator_action(ctx.job_id, "ops (test)").changed)
        return real(ctx)

    swap_handler(tasks.add.module_path, taken_back_while_running)
    runner.drain()
    assert wait_for_finished_notices(10)
    assert acted == [True]
    job = Job.objects.get(pk=int(result.id))
    assert RejectedWrite.objects.filter(job=job, attempt_presented=1, write="commit").exists()
    if operator_action is transitions.cancel:
        assert job.state == "cancelled"
        assert finished == []
    else:  # requeued: the drain claimed it again (attempt 2) and that run's commit is announced
        assert (job.state, job.attempt) == ("succeeded", 2)
        assert finished == [(result.id, "SUCCESSFUL")]


def test_an_operators_cancel_of_a_queued_task_sends_no_task_finished(finished):
    result = tasks.add.enqueue(1, 2)
    assert transitions.cancel(int(result.id), "ops (test)").changed
    assert wait_for_finished_notices(10)
    assert finished == []


def test_a_unique_key_function_returning_none_means_no_key():
    first = keyed_when_asked.enqueue()
    second = keyed_when_asked.enqueue()
    keyed = keyed_when_asked.enqueue(key="k")
    again = keyed_when_asked.enqueue(key="k")
    assert first.id != second.id  # no key: a job each
    assert again.id == keyed.id  # a key: the live job
    assert list(Job.objects.order_by("pk").values_list("unique_key", flat=True)) == [
        None,
        None,
        f"task:default:{keyed_when_asked.module_path}:k",
    ]
