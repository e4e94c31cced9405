"""Arguments the task's function would refuse are refused at enqueue, as Celery's apply_async
does: a TypeError naming the task and what is wrong, and nothing written. Before, such a task was
enqueued and failed in the worker, every attempt of it, after a retry cycle."""

import sys
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus

from jobs.models import Job
from jobs.tasks.backend import check_arguments
from jobs.worker import runner
from tests.app import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("enqueue", "error"),
    [
        (lambda: tasks.add.enqueue(1, 2, 3), "too many positional arguments"),
        (lambda: tasks.add.enqueue(1, 2, c=3), "got an unexpected keyword argument 'c'"),
        (lambda: tasks.add.enqueue(1), "missing a required argument: 'b'"),
        (lambda: tasks.add.enqueue(1, a=2), "multiple values for argument 'a'"),
        (lambda: tasks.add.enqueue(1, **{"b": 2, "7": 3}), "unexpected keyword argument '7'"),
        (lambda: tasks.report.enqueue("2026-12-01"), "too many positional arguments"),
        # takes_context: the worker passes the context first, so it is not the caller's to give
        (lambda: tasks.flaky.enqueue(), "missing a required argument: 'succeed_on'"),
        (lambda: tasks.introspect.enqueue("a", "b"), "too many positional arguments"),
        (lambda: tasks.introspect.enqueue(context=1), "multiple values for argument 'context'"),
        (lambda: tasks.async_add.enqueue(1), "missing a required argument: 'b'"),
    ],
)
def test_arguments_the_function_would_refuse_are_a_type_error_and_nothing_is_enqueued(
    enqueue, error
):
    with pytest.raises(TypeError, match=error) as raised:
        enqueue()
    assert "cannot take these arguments" in str(raised.value)
    assert Job.objects.count() == 0


def test_the_error_names_the_task_and_its_signature():
    with pytest.raises(TypeError) as raised:
        tasks.add.enqueue(1)
    assert str(raised.value) == (
        "task tests.app.tasks.add(a: int, b: int) cannot take these arguments: "
        "missing a required argument: 'b' (nothing was enqueued)"
    )


def test_aenqueue_refuses_them_too():
    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        async_to_sync(tasks.add.aenqueue)(1)
    assert Job.objects.count() == 0


def test_a_refused_enqueue_leaves_the_callers_transaction_usable():
    with transaction.atomic():
        with pytest.raises(TypeError):
            tasks.add.enqueue(1, 2, 3)
        result = tasks.add.enqueue(1, 2)
    assert list(Job.objects.values_list("id", flat=True)) == [int(result.id)]


@pytest.mark.parametrize(
    ("enqueue", "expected"),
    [
        (lambda: tasks.add.enqueue(1, b=2), 3),
        (lambda: tasks.add.enqueue(a=1, b=2), 3),
        (lambda: tasks.report.enqueue(day="d"), "d"),
        (lambda: tasks.introspect.enqueue(), ""),
        (lambda: tasks.introspect.enqueue("t"), "t"),
        # A decorator's wrapper takes any arguments: bound to the wrapped function's signature
        # (`greeting, name`), this one-argument call would be refused although it runs.
        (lambda: tasks.greet.enqueue("world"), "hello world"),
    ],
)
def test_arguments_the_function_takes_are_enqueued_and_run(enqueue, expected):
    result = enqueue()
    assert Job.objects.filter(pk=int(result.id)).exists()
    assert runner.drain() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    value = result.return_value
    assert (value["tag"] if isinstance(value, dict) else value) == expected


def test_a_function_whose_signature_cannot_be_read_takes_any_arguments():
    def opaque(*args):
        return args

    opaque.__signature__ = "not a signature"  # inspect.signature raises TypeError for it
    task = SimpleNamespace(func=opaque, takes_context=False, module_path="tests.opaque")
    check_arguments(task, [1, 2, 3], {"x": 1})  # no error: as before the check existed


def test_a_function_whose_signature_raises_when_read_takes_any_arguments():
    """Reading a signature runs code (a `__signature__` callable; from Python 3.14 annotations
    evaluated when read): whatever it raises, the call is not refused -- it was a NameError out
    of enqueue for a task that runs."""

    def lazy(*args):
        return args

    def unreadable():
        raise NameError("name 'Decimal' is not defined")

    lazy.__signature__ = unreadable  # inspect.signature calls it
    task = SimpleNamespace(func=lazy, takes_context=False, module_path="tests.lazy")
    check_arguments(task, [1, 2, 3], {"x": 1})  # no error: as a signature that cannot be read


@pytest.mark.skipif(sys.version_info < (3, 14), reason="PEP 649's lazy annotations: Python 3.14")
def test_a_task_annotated_with_a_name_only_type_checkers_import_is_enqueued():
    from tests.app import deferred_annotations

    result = deferred_annotations.charge.enqueue("9.99")
    assert Job.objects.filter(pk=result.id, kind=deferred_annotations.charge.module_path).exists()
    with pytest.raises(TypeError, match="missing a required argument: 'amount'"):
        deferred_annotations.charge.enqueue()  # the signature is still read and checked


class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("a default whose repr raises")


_UNPRINTABLE = _Unprintable()


def test_refused_arguments_are_a_type_error_even_when_the_signature_cannot_be_printed():
    """The message shows the signature; one holding a default whose repr() raises still gives
    the TypeError (it was that RuntimeError, out of enqueue)."""

    def guarded(a, marker=_UNPRINTABLE):
        return a

    task = SimpleNamespace(func=guarded, takes_context=False, module_path="tests.guarded")
    with pytest.raises(TypeError, match=r"task tests\.guarded\(\.\.\.\) cannot take these"):
        check_arguments(task, [1, 2, 3], {})
