"""Django's @task on the embedded SQLite default (`bin/run`): enqueue, run, result, signals."""

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished
from django.test import override_settings

from jobs.models import Job
from jobs.tasks.execution import wait_for_finished_notices
from jobs.worker import runner
from tests.app import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_a_task_runs_and_reports_its_result_on_sqlite():
    heard = []

    def receiver(sender, task_result, **kwargs):
        heard.append(task_result.status)

    task_finished.connect(receiver, weak=False)
    try:
        result = tasks.introspect.enqueue(tag="sqlite")
        runner.drain()
        assert wait_for_finished_notices(10)
    finally:
        task_finished.disconnect(receiver)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["attempt"] == result.return_value["fencing_attempt"] == 1
    assert result.worker_ids == [runner.worker_identity()]
    assert heard == [TaskResultStatus.SUCCESSFUL]


@override_settings(JOBS={"RETRY_BASE_SECONDS": 0.0})
def test_retries_and_errors_on_sqlite():
    result = tasks.flaky.enqueue(succeed_on=2)
    runner.drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.SUCCESSFUL, 2)
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"]


def test_a_rolled_back_enqueue_leaves_nothing_on_sqlite():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        raise RuntimeError("roll back")
    assert not Job.objects.exists()


@override_settings(JOBS={"RETRY_BASE_SECONDS": 0.0})
def test_a_result_that_cannot_be_stored_fails_once_and_bad_arguments_write_nothing_on_sqlite():
    result = tasks.unencodable.enqueue("set")
    runner.drain()
    runner.drain()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    assert [e.exception_class_path for e in result.errors] == [
        "jobs.tasks.execution.UnencodableResult"
    ]
    with pytest.raises(TypeError, match="too many positional arguments"):
        tasks.add.enqueue(1, 2, 3)
    assert Job.objects.count() == 1
