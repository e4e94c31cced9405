"""`@task` functions the tests drive (django.tasks on jobs.tasks.PalisadeBackend, tests/settings).

Durations come from the arguments, per attempt, so a test decides how long an attempt runs.
"""

import asyncio
import functools
import os
import time
from typing import Any

from django.tasks import TaskContext, task
from django.tasks.signals import task_finished, task_started

from jobs.tasks import job_context


def _seconds(context: TaskContext, seconds_by_attempt: dict[str, float], default: float) -> float:
    return float(seconds_by_attempt.get(str(context.attempt), default))


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="tasks", priority=5)
def shout(text: str) -> str:
    return text.upper()


@task(takes_context=True)
def introspect(context: TaskContext, tag: str = "") -> dict[str, Any]:
    """What the task sees of itself: Django's context and Palisade's JobContext behind it."""
    ctx = job_context(context)
    ctx.checkpoint({"tag": tag})  # a fenced write through the JobContext
    return {
        "tag": tag,
        "attempt": context.attempt,
        "fencing_attempt": ctx.attempt,
        "job_id": ctx.job_id,
        "result_id": context.task_result.id,
        "status": context.task_result.status,
        "worker_ids": context.task_result.worker_ids,
        "worker": context.job.worker,
    }


@task(takes_context=True, max_attempts=3)
def flaky(context: TaskContext, succeed_on: int) -> dict[str, int]:
    if context.attempt < succeed_on:
        raise RuntimeError(f"flaky on attempt {context.attempt}")
    return {"attempt": context.attempt}


class Refused(Exception):
    pass


@task(max_attempts=2)
def always_fails(text: str) -> None:
    raise Refused(text)


@task
def unjsonable() -> Any:
    return {1, 2, 3}


def _cycle() -> list[Any]:
    cycle: list[Any] = []
    cycle.append(cycle)
    return cycle


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


class _RaisingItems(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("hostile items()")


UNENCODABLE = {
    "set": lambda: {"ok": 1, "bad": {1, 2}},
    "object": object,
    "nan": lambda: [float("nan")],
    "bytes": lambda: b"\xff",  # not UTF-8
    "deep": lambda: _nested(100),  # past the 64 levels a result may have
    "recursion": lambda: _nested(5000),  # past Python's recursion limit
    "cycle": _cycle,
    "large": lambda: "x" * 300_000,  # past JOBS["MAX_PAYLOAD_BYTES"] (256 KiB by default)
    "items_raise": lambda: _RaisingItems(a=1),  # its own code raises while it is read
    "colliding": lambda: {"x": {1: "a", "1": "b"}},  # one JSON key: one value would be lost
    "colliding_bytes": lambda: {b"k": 1, "k": 2},  # one key once normalised (b"k" decoded)
}


@task
def unencodable(what: str) -> Any:
    """Returns a value that cannot be stored as a result, of the sort `what` names."""
    return UNENCODABLE[what]()


@task(takes_context=True, lease_seconds=600, max_attempts=7, timeout=30)
def long_lease(context: TaskContext) -> float:
    return context.job._held.lease_seconds


@task(unique_key="the-only-one")
def singleton(n: int) -> int:
    return n


@task(unique_key=lambda args, kwargs: f"report-{kwargs['day']}")
def report(*, day: str) -> str:
    return day


@task(takes_context=True)
def sleepy(context: TaskContext, seconds_by_attempt: dict[str, float]) -> dict[str, Any]:
    """Sleeps (the runner's background heartbeat still runs) as long as this attempt is told."""
    time.sleep(_seconds(context, seconds_by_attempt, 0.0))
    return {"attempt": context.attempt, "worker": job_context(context).worker}


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task(max_attempts=1)
async def cancels_its_own_work() -> None:
    """Awaits work it cancelled: asyncio.CancelledError comes out of the task's own loop."""
    inner = asyncio.ensure_future(asyncio.sleep(60))
    inner.cancel()
    await inner


class FieldsError(Exception):
    """An API client's error whose fields live in a dict: a name it lacks is a KeyError, not an
    AttributeError -- so is `__notes__`, which formatting its traceback reads."""

    def __init__(self, message: str, fields: dict[str, Any]) -> None:
        super().__init__(message)
        self.fields = fields

    def __getattr__(self, name: str) -> Any:
        return self.fields[name]


class UnreadableNotes(Exception):
    """Its notes raise when read: formatting its traceback raises."""

    @property
    def __notes__(self) -> Any:
        raise RuntimeError("its notes cannot be read")


@task(max_attempts=1)
def raises_hostile(which: str) -> None:
    if which == "fields":
        raise FieldsError("the API said no", {"status": 402})
    raise UnreadableNotes("boom")


def _greeting(func: Any) -> Any:
    """A decorator that supplies the first argument: its wrapper, which takes any arguments, is
    what a worker calls, not the function `functools.wraps` says it wraps."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func("hello", *args, **kwargs)

    return wrapper


@task
@_greeting
def greet(greeting: str, name: str) -> str:
    return f"{greeting} {name}"


@task(backend="immediate")
def on_immediate(x: int) -> int:
    return x


def _log_signal(name: str) -> Any:
    """In a qcluster started with PALISADE_TEST_TASK_SIGNALS=<file>, each task signal appends a
    line `<name> <id> <status> <attempts>` to that file (acceptance tests read it)."""

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        path = os.environ.get("PALISADE_TEST_TASK_SIGNALS")
        if path:
            line = f"{name} {task_result.id} {task_result.status} {task_result.attempts}\n"
            with open(path, "a") as log:
                log.write(line)

    return receiver


for _name, _signal in (("started", task_started), ("finished", task_finished)):
    _signal.connect(_log_signal(_name), weak=False, dispatch_uid=f"tests.app.tasks.{_name}")
