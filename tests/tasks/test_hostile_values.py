"""A task's hostile values stay that task's problem, and the backend answers as Django's API says:
an exception whose own code raises while its traceback is formatted, arguments a row holds
nested past what Python can normalise, a queue name that no QUEUES restricts, a module path
a plain handler already holds, a run_after whose UTC offset PostgreSQL refuses."""

import dataclasses
import datetime as dt

import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

import jobs
from jobs.core import registry
from jobs.models import Attempt, Job, one_statement
from jobs.tasks import MalformedTask, PalisadeTask
from jobs.worker import runner
from tests.app import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("which", "cls"), [("fields", tasks.FieldsError), ("notes", tasks.UnreadableNotes)]
)
def test_an_error_whose_own_code_raises_when_formatted_fails_its_task_alone_by_its_class(
    which, cls
):
    # Before: noting its class (getattr(exc, "__notes__")) or formatting its traceback raised,
    # the drain ended without failing the task (left running until its lease ran out: a
    # LeaseExpired, not its class) and the tasks claimed with it were stranded with it.
    hostile = tasks.raises_hostile.using(priority=5).enqueue(which)
    others = [tasks.add.enqueue(n, n) for n in range(3)]
    raised = None
    try:
        runner.drain()
    except Exception as exc:  # noqa: BLE001  named only: pytest itself cannot format this one
        raised = type(exc).__name__
    assert raised is None, f"the drain raised {raised}"
    hostile.refresh()
    assert hostile.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in hostile.errors] == [f"tests.app.tasks.{cls.__name__}"]
    assert hostile.errors[0].exception_class is cls
    for result in others:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 2 * result.args[0]


def test_a_task_row_whose_arguments_python_cannot_normalise_is_malformed_not_a_recursion_error():
    # Nested 1,100 deep: within what json decodes (its own limit), past Python's recursion limit,
    # which Django's TaskResult meets normalising the arguments. Before: get_result raised
    # RecursionError (Django's contract: TaskResultDoesNotExist), and so did each attempt.
    job = jobs.enqueue(tasks.add.module_path, {"args": [1, 2], "backend": "default"})
    deep = "[" * 1100 + "]" * 1100
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_job SET payload = jsonb_build_object('args', %s::jsonb, "
            "'backend', 'default') WHERE id = %s",
            [deep, job.pk],
        )
    for read in (default_task_backend.get_result, tasks.add.get_result):
        with pytest.raises(MalformedTask, match=f"job {job.pk} .*arguments nested too deep"):
            read(str(job.pk))
    others = [tasks.add.enqueue(n, 1) for n in range(2)]
    runner.drain()
    (attempt,) = Attempt.objects.filter(job=job)
    assert "MalformedTask" in attempt.error and "RecursionError" not in attempt.error
    for result in others:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL


def test_with_queues_empty_any_queue_a_job_can_carry_is_valid_and_no_other(settings):
    # Django's base allows any queue name when QUEUES is empty. Before: a name no job can carry
    # passed validate_task and every enqueue raised jobs.InvalidQueue; one that is not text
    # (a list) was a TypeError from Django's own `in QUEUES`.
    settings.TASKS = {"default": {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": []}}
    result = tasks.add.using(queue_name="reports").enqueue(1, 2)
    assert Job.objects.get(pk=int(result.id)).queue == "reports"
    for bad in ("bad name!", "x" * 65, "", "default\n", ["default"], None, 5):
        with pytest.raises(InvalidTask, match="must match"):
            dataclasses.replace(tasks.add, queue_name=bad)
    assert Job.objects.count() == 1


def test_a_task_whose_module_path_a_plain_handler_holds_is_invalid_and_no_task():
    """Before: validate_task raised HandlerAlreadyRegistered (not Django's InvalidTask) after
    recording the function as that kind's task, so get_result() read the plain handler's jobs
    as results of it."""
    kind = "tests.app.clash.f"

    def plain(ctx):
        return None

    def f():
        return None

    f.__module__, f.__qualname__ = "tests.app.clash", "f"
    registry.handler(kind)(plain)
    try:
        with pytest.raises(InvalidTask, match="already handled by"):
            PalisadeTask(func=f)
        job = jobs.enqueue(kind, {})
        with pytest.raises(TaskResultDoesNotExist, match="is not a task"):
            default_task_backend.get_result(str(job.pk))
        assert registry.get_handler(kind).fn is plain
    finally:
        registry._handlers.pop(kind, None)


def test_a_run_after_whose_utc_offset_postgresql_refuses_is_stored_as_the_same_instant(
    monkeypatch,
):
    """Python allows a UTC offset up to 23:59, PostgreSQL none past 15:59. The one-statement
    enqueue sends the instant (psycopg binds it); its fallback -- the savepoint path, taken when
    that statement cannot decide (a key's holder committed after its snapshot began) -- inserts
    through the ORM, whose SQL literal keeps the offset. Before: there the database's DataError
    aborted the caller's transaction, a task's run_after and a plain job's run_at alike."""
    monkeypatch.setattr(one_statement, "enqueue", lambda *args, **kwargs: None)  # undecided
    later = dt.datetime.now(dt.timezone(dt.timedelta(hours=20))) + dt.timedelta(hours=1)
    with transaction.atomic():
        result = tasks.add.using(run_after=later).enqueue(1, 2)
        plain = jobs.enqueue("test.echo", run_at=later)
        assert Job.objects.count() == 2  # the caller's transaction goes on
    assert Job.objects.get(pk=int(result.id)).run_at == later == plain.run_at
    assert tasks.add.get_result(result.id).task.run_after == later
