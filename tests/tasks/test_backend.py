"""The backend as Django's task API sees it: flags, validate_task, enqueue, get_result."""

import dataclasses
import datetime as dt

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.exceptions import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)

import jobs
from jobs.core import registry
from jobs.models import Job
from jobs.tasks import MalformedTask, PalisadeBackend, PalisadeTask, UniqueKeyHeld
from tests.app import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_backend_declares_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, PalisadeBackend)
    assert backend.supports_defer is True
    assert backend.supports_priority is True
    assert backend.supports_get_result is True
    assert backend.supports_async_task is True
    assert backend.task_class is PalisadeTask
    assert backend.queues == {"default", "tasks"}


def test_enqueue_inserts_a_job_named_by_the_module_path():
    result = tasks.add.enqueue(2, b=3)
    job = Job.objects.get(pk=int(result.id))
    assert job.kind == "tests.app.tasks.add" == tasks.add.module_path
    assert job.state == "queued"
    assert job.payload == {"args": [2], "kwargs": {"b": 3}, "backend": "default", "run_after": None}
    assert (job.queue, job.priority) == ("default", 0)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.backend == "default" and result.task.func is tasks.add.func
    assert result.enqueued_at == job.created_at
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None,) * 3
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_priority_queue_and_run_after_map_onto_the_job():
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    result = tasks.shout.using(priority=-7, run_after=later).enqueue("hi")
    job = Job.objects.get(pk=int(result.id))
    assert (job.queue, job.priority, job.run_at) == ("tasks", -7, later)
    assert result.task.priority == -7 and result.task.queue_name == "tasks"
    fetched = tasks.shout.get_result(result.id)
    assert fetched.task.run_after == later and fetched.task.priority == -7


def test_task_options_carry_lease_max_attempts_and_timeout():
    result = tasks.long_lease.enqueue()
    job = Job.objects.get(pk=int(result.id))
    assert (job.lease_seconds, job.max_attempts) == (600.0, 7)
    assert tasks.long_lease.timeout == 30
    # ... and handed to the runner: the task's kind carries it as @handler(timeout=...) does
    # (enforced by the worker: tests/acceptance/test_timeouts.py).
    assert registry.get_handler(tasks.long_lease.module_path).timeout == 30


def test_a_static_unique_key_returns_the_live_job_instead_of_a_second():
    first = tasks.singleton.enqueue(1)
    second = tasks.singleton.enqueue(2)
    assert second.id == first.id and second.args == [1]
    assert Job.objects.filter(kind=tasks.singleton.module_path).count() == 1


def test_a_unique_key_function_sees_the_arguments():
    a = tasks.report.enqueue(day="2026-12-01")
    b = tasks.report.enqueue(day="2026-12-01")
    c = tasks.report.enqueue(day="2026-12-02")
    assert a.id == b.id != c.id
    stored = Job.objects.get(pk=int(c.id)).unique_key
    assert stored == "task:default:tests.app.tasks.report:report-2026-12-02"


@pytest.mark.parametrize(
    ("kind", "payload"),
    [("test.echo", {}), (tasks.add.module_path, {"args": [1, 2], "backend": "default"})],
)
def test_a_tasks_key_never_meets_a_plain_jobs_or_another_tasks(settings, kind, payload):
    # Before: the key was stored as given, so enqueue returned whichever live job held it -- a
    # plain job (TaskResultDoesNotExist from enqueue) or another task (a result of that task).
    holder = jobs.enqueue(kind, payload, unique_key="the-only-one")  # the key as given
    keyed_add = dataclasses.replace(tasks.add, unique_key="the-only-one")
    settings.TASKS = {**settings.TASKS, "second": settings.TASKS["default"]}

    mine = tasks.singleton.enqueue(5)
    added = keyed_add.enqueue(1, 2)
    elsewhere = tasks.singleton.using(backend="second").enqueue(6)

    assert len({holder.pk, *(int(r.id) for r in (mine, added, elsewhere))}) == 4
    assert tasks.singleton.get_result(mine.id).args == [5]
    assert added.task.func is tasks.add.func and elsewhere.backend == "second"
    assert tasks.singleton.enqueue(7).id == mine.id  # this task's own key: the live job
    assert keyed_add.enqueue(3, 4).id == added.id
    assert tasks.singleton.using(backend="second").enqueue(8).id == elsewhere.id
    assert Job.objects.get(pk=int(mine.id)).unique_key == (
        "task:default:tests.app.tasks.singleton:the-only-one"
    )


@pytest.mark.parametrize(
    ("kind", "payload", "reason"),
    [
        ("test.echo", {}, "is not a task of backend 'default'"),
        (tasks.add.module_path, {"args": [1], "backend": "default"}, "it is a tests.app.tasks.add"),
        (tasks.singleton.module_path, {"args": 5, "backend": "default"}, "args is int"),
    ],
)
def test_a_tasks_key_held_by_a_row_planted_with_it_is_refused_naming_the_holder(
    kind, payload, reason
):
    key = "task:default:tests.app.tasks.singleton:the-only-one"
    planted = jobs.enqueue(kind, payload, unique_key=key)
    with pytest.raises(
        UniqueKeyHeld, match=f"held by live job {planted.pk} \\({kind}\\)"
    ) as refused:
        tasks.singleton.enqueue(5)
    assert reason in str(refused.value) and repr(key) in str(refused.value)
    assert Job.objects.count() == 1


def test_a_tasks_key_is_bounded_as_stored():
    with pytest.raises(jobs.InvalidOption, match="stored as task:<backend alias>"):
        tasks.report.enqueue(day="d" * 160)  # 160 < 200, but not with its prefix
    with pytest.raises(jobs.InvalidOption, match="must be a string, not int"):
        dataclasses.replace(tasks.add, unique_key=lambda args, kwargs: 5).enqueue(1, 2)
    assert Job.objects.count() == 0


def test_enqueue_joins_the_callers_transaction_and_a_rollback_enqueues_nothing():
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        tasks.add.enqueue(1, 1)
        assert Job.objects.count() == 1  # visible to the caller's own transaction
        raise Boom
    assert Job.objects.count() == 0


def test_enqueue_is_invisible_to_others_until_the_caller_commits(second_connection):
    with transaction.atomic():
        result = tasks.add.enqueue(1, 1)
        seen = second_connection.execute(
            "SELECT count(*) FROM jobs_job WHERE id = %s", [int(result.id)]
        ).fetchone()[0]
        assert seen == 0
    seen = second_connection.execute(
        "SELECT count(*) FROM jobs_job WHERE id = %s", [int(result.id)]
    ).fetchone()[0]
    assert seen == 1


def test_arguments_must_be_json_and_are_bounded_like_a_payload(settings):
    with pytest.raises(jobs.InvalidPayload, match="JSON"):
        tasks.add.enqueue({1, 2}, 3)
    with pytest.raises(jobs.InvalidPayload):
        tasks.add.enqueue(float("nan"), 1)
    with pytest.raises(jobs.InvalidPayload):
        tasks.add.enqueue("a\x00b", 1)
    settings.JOBS = {"MAX_PAYLOAD_BYTES": 1024}
    with pytest.raises(jobs.PayloadTooLarge):
        tasks.add.enqueue("x" * 2000, 1)
    assert Job.objects.count() == 0


def _deep(depth):
    value = 0
    for _ in range(depth):
        value = [value]
    return value


def test_arguments_nested_past_the_recursion_limit_or_cyclic_are_an_invalid_payload():
    # Before: Django's normalize_json recursed and raised RecursionError, not InvalidPayload.
    cycle: list = []
    cycle.append(cycle)
    for args, kwargs in [((_deep(5000),), {}), ((), {"deep": _deep(5000)}), ((cycle,), {})]:
        with pytest.raises(jobs.InvalidPayload, match="nested deeper than 64 levels"):
            tasks.add.enqueue(*args, **kwargs)
    with pytest.raises(jobs.InvalidPayload, match="nested deeper than 64 levels"):
        tasks.add.enqueue(_deep(100), 1)  # within Python's limit: the payload bound says so
    assert Job.objects.count() == 0


def test_tuples_and_bytes_are_normalised_as_django_does():
    result = tasks.add.enqueue((1, 2), b"3")
    assert result.args == [[1, 2], "3"]
    assert Job.objects.get(pk=int(result.id)).payload["args"] == [[1, 2], "3"]


@pytest.mark.parametrize("path", ["one statement", "savepoint"])
def test_enqueues_result_holds_the_arguments_as_stored_as_get_result_does(monkeypatch, path):
    # The worker calls the task with its arguments as stored (JSON: an object's keys are text).
    # Before, on the savepoint path (SQLite's, and PostgreSQL's when its one statement cannot
    # decide), enqueue's result kept the caller's {1: "x"} while get_result() said {"1": "x"}.
    if path == "savepoint":
        monkeypatch.setattr("jobs.models.one_statement.enqueue", lambda *args, **kwargs: None)
    result = tasks.add.enqueue({1: "x", 2.5: [(1, 2)]}, b={True: None, None: b"y"})
    stored = tasks.add.get_result(result.id)
    assert result.args == stored.args == [{"1": "x", "2.5": [[1, 2]]}]
    assert result.kwargs == stored.kwargs == {"b": {"true": None, "null": "y"}}
    assert Job.objects.get(pk=int(result.id)).payload["args"] == result.args


# -- validate_task -------------------------------------------------------------------------


def _nested():
    @task
    def inner():
        return None

    return inner


async def _coroutine_task():
    return 1


def _no_context(x):
    return x


def _refused(**changes):
    base = {"func": tasks.add.func}
    return PalisadeTask(**{**base, **changes})


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_nested, "module level"),
        (lambda: _refused(func=_no_context, takes_context=True), "first argument of 'context'"),
        (lambda: _refused(priority=101), "priority must be a whole number"),
        (lambda: _refused(priority=-101), "priority must be a whole number"),
        (lambda: _refused(priority=1.5), "priority must be a whole number"),
        # what enqueue would refuse is refused when the task is made, with Django's error (not a
        # ValueError or TypeError from Django's own comparison, nor an InvalidOption per enqueue)
        (lambda: _refused(priority=5.0), "priority must be a whole number"),
        (lambda: _refused(priority=True), "priority must be a whole number"),
        (lambda: _refused(priority=float("nan")), "priority must be a whole number"),
        (lambda: _refused(priority="5"), "priority must be a whole number"),
        (lambda: _refused(priority=None), "priority must be a whole number"),
        (lambda: _refused(queue_name="nowhere"), "Queue 'nowhere' is not valid"),
        (lambda: _refused(run_after=dt.datetime(2030, 1, 1)), "aware"),
        (lambda: _refused(run_after=dt.datetime(1990, 1, 1, tzinfo=dt.UTC)), "run_after"),
        (lambda: tasks.add.using(run_after=dt.timedelta(seconds=5)), "not timedelta"),
        (lambda: tasks.add.using(run_after=dt.date(2030, 1, 1)), "not date"),
        (lambda: tasks.add.using(run_after="2030-01-01T00:00:00+00:00"), "not str"),
        (lambda: _refused(lease_seconds=0.01), "lease_seconds"),
        (lambda: _refused(max_attempts=0), "max_attempts"),
        (lambda: _refused(timeout=-1), "timeout"),
        (lambda: _refused(unique_key=42), "unique_key"),
    ],
)
def test_validate_task_refuses(make, message):
    with pytest.raises(InvalidTask, match=message):
        make()


def test_validate_task_refuses_a_module_path_too_long_to_be_a_kind():
    def f():
        return None

    f.__module__ = "tests.app." + "m" * 100
    f.__qualname__ = "f"
    with pytest.raises(InvalidTask, match="names the job kind"):
        PalisadeTask(func=f)


def test_using_a_queue_outside_queues_is_refused_before_anything_is_written():
    with pytest.raises(InvalidTask):
        tasks.add.using(queue_name="elsewhere").enqueue(1, 2)
    assert Job.objects.count() == 0


# -- get_result ----------------------------------------------------------------------------


def test_get_result_of_an_unknown_id_raises_does_not_exist():
    for bad in ("999999", "nope", "-1", "99999999999999999999999"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(bad)


def test_get_result_takes_an_id_only_as_an_int_or_its_decimal_text():
    result = tasks.add.enqueue(2, 3)
    job_id = int(result.id)
    assert default_task_backend.get_result(job_id).id == result.id
    assert default_task_backend.get_result(str(job_id)).id == result.id
    # int() would read each of these as the job's id: another value is no result's id.
    for other in (job_id + 0.7, float(job_id), f"{job_id}.0", f" {job_id}", f"+{job_id}", "٣"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(other)


def test_true_names_no_result_even_where_job_1_is_a_task():
    """True == 1 to Python; it is no TaskResult.id (an int or its decimal text)."""
    Job.objects.create(id=1, kind=tasks.add.module_path, payload={"args": [2, 3], "kwargs": {}})
    assert default_task_backend.get_result(1).args == [2, 3]
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(True)


def test_get_result_refuses_a_task_of_another_backend(settings):
    settings.TASKS = {**settings.TASKS, "second": settings.TASKS["default"]}
    elsewhere = tasks.add.using(backend="second").enqueue(1, 2)
    assert task_backends["second"].get_result(elsewhere.id).args == [1, 2]
    with pytest.raises(TaskResultDoesNotExist, match="not a task of backend 'default'"):
        task_backends["default"].get_result(elsewhere.id)


def test_get_result_refuses_a_plain_job_that_is_not_a_task():
    job = jobs.enqueue("test.echo", {"n": 1})
    with pytest.raises(TaskResultDoesNotExist, match="not a task"):
        default_task_backend.get_result(str(job.pk))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"backend": "default", "args": 5}, "args is int, not a list"),
        ({"backend": "default", "kwargs": [["a", 1]]}, "kwargs is list, not an object"),
        ({"backend": "default", "run_after": "not a date"}, "'not a date' is not an aware ISO"),
        ({"backend": "default", "run_after": "2026-12-01T10:00:00"}, "is not an aware ISO"),
        ({"backend": "default", "run_after": 5}, "run_after is int"),
        ({"backend": 5}, "backend is int, not text"),
        ([1, 2], "its payload is list, not an object"),
    ],
)
def test_get_result_of_a_task_row_whose_payload_is_not_a_tasks_says_why(payload, reason):
    # Before: a TypeError or ValueError from deep inside (a 500 in any view that reads it).
    job = jobs.enqueue(tasks.add.module_path, payload)
    for read in (default_task_backend.get_result, tasks.add.get_result):
        with pytest.raises(MalformedTask, match=reason) as refused:
            read(str(job.pk))
        assert isinstance(refused.value, TaskResultDoesNotExist)  # Django's contract
        assert f"job {job.pk} (tests.app.tasks.add) is not a well-formed task" in str(refused.value)


def test_task_get_result_refuses_another_tasks_result():
    result = tasks.add.enqueue(1, 2)
    assert tasks.add.get_result(result.id).id == result.id
    with pytest.raises(TaskResultMismatch):
        tasks.shout.get_result(result.id)


def test_refresh_rereads_the_job():
    result = tasks.add.enqueue(1, 2)
    now = dt.datetime.now(dt.UTC)
    Job.objects.filter(pk=int(result.id)).update(state="cancelled", finished_at=now)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "jobs.tasks.results.TaskCancelled"


# -- async variants ------------------------------------------------------------------------


def test_aenqueue_and_aget_result():
    async def scenario():
        result = await tasks.add.aenqueue(4, 5)
        fetched = await tasks.add.aget_result(result.id)
        again = await default_task_backend.aget_result(result.id)
        await fetched.arefresh()
        return result, fetched, again

    # As Django's async tests run: thread-sensitive database calls come back to this thread.
    result, fetched, again = async_to_sync(scenario)()
    assert fetched.id == again.id == result.id
    assert fetched.status == TaskResultStatus.READY and fetched.args == [4, 5]
    assert Job.objects.filter(pk=int(result.id), kind=tasks.add.module_path).exists()


def test_a_coroutine_task_is_accepted():
    assert tasks.async_add.enqueue(1, 2).status == TaskResultStatus.READY


# -- system checks -------------------------------------------------------------------------


def test_a_queue_name_no_job_can_carry_is_an_error(settings):
    settings.TASKS = {"default": {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": ["bad name"]}}
    assert [m.id for m in task_backends["default"].check()] == ["jobs.E030"]


def test_a_queue_the_workers_do_not_serve_is_a_warning(settings):
    settings.TASKS = {"default": {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": ["x", "y"]}}
    settings.JOBS = {"QUEUES": ["x"]}
    messages = task_backends["default"].check()
    assert [(m.id, "'y'" in m.msg) for m in messages] == [("jobs.W031", True)]


@pytest.mark.parametrize(
    "queues",
    ["default", b"default", 5, None, [5], ["default", None], {"default": 1}, (q for q in "ab")],
)
def test_queues_that_are_not_a_list_of_names_are_refused_by_name(queues):
    """Django's base makes set(QUEUES): "default" would be the queues 'd', 'e', 'f', ... (every
    task on 'default' refused as outside them), 5 a TypeError, [5] a TypeError in the checks."""
    with pytest.raises(InvalidTaskBackend, match=r"TASKS\['other'\]\['QUEUES'\] must be a list"):
        PalisadeBackend("other", {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": queues})


def test_options_are_not_read_and_a_backend_that_has_some_says_so():
    params = {"BACKEND": "jobs.tasks.PalisadeBackend", "OPTIONS": {"lease_seconds": 5}}
    messages = PalisadeBackend("other", params).check()
    assert [m.id for m in messages] == ["jobs.W032"]
    assert "lease_seconds" in messages[0].msg


def test_the_configured_backend_passes_its_checks():
    assert task_backends["default"].check() == []
