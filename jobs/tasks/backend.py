"""`PalisadeBackend`: Django's `django.tasks` API (6.1) on Palisade's fenced engine.

Owns: validating a Task (`validate_task`), enqueueing it as a job (`enqueue`, `aenqueue`) and
reading its result back (`get_result`, `aget_result`), and `PalisadeTask`, the task class whose
extra `@task(...)` options carry Palisade's per-task settings.

A task is the job of the kind named by its module path (`myapp.tasks.send_report`), payload
`{"args": [...], "kwargs": {...}, "backend": alias, "run_after": iso | null}`; its TaskResult id
is the job's id. Enqueue is `jobs.enqueue()`: it joins the caller's transaction (nothing is
visible, and task_enqueued is not sent, until the caller commits; a rollback enqueues nothing).
A task's unique key is stored as `task:<backend alias>:<module path>:<key>` (`stored_key`), so it
never meets another task's or a plain job's.

Never: stores a result anywhere but the job tables, or runs a task (jobs.tasks.execution does,
inside a worker). Bad input raises before anything is written: InvalidTask from validate_task,
enqueue's ValueError family (jobs.InvalidPayload, jobs.PayloadTooLarge, ...) for arguments that
are not JSON, and TypeError for arguments the task's function would refuse (`check_arguments`:
they would fail every attempt in the worker, retries and all, as Celery's apply_async says too).
"""

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.checks import CheckMessage, Error, Warning
from django.db import transaction
from django.tasks import DEFAULT_TASK_QUEUE_NAME
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskResult
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from jobs.core import bounds
from jobs.core.conf import jobs_settings
from jobs.core.enqueue import QUEUE_NAME
from jobs.core.exceptions import (
    EnqueueError,
    HandlerAlreadyRegistered,
    InvalidOption,
    InvalidPayload,
)
from jobs.core.registry import KIND, TIMEOUT_SECONDS
from jobs.models import Job
from jobs.tasks import execution, results
from jobs.tasks.normalized import normalized

UniqueKey = str | Callable[[list[Any], dict[str, Any]], str | None] | None
TASK_KEY = "task:<backend alias>:<module path>:<key>"


class UniqueKeyHeld(EnqueueError):
    """A task's stored unique key is held by a live job that is not that task's on that backend
    (a row planted with the key by `jobs.enqueue()`, the admin or SQL, or a task row whose payload
    is malformed): there is no result of this task to return, so enqueue writes nothing and says
    which job holds the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PalisadeTask(Task):
    """A Task with Palisade's options, given to `@task(...)` beside Django's own:

    lease_seconds, max_attempts: as `@handler`'s (bounded the same way);
    unique_key: a string, or `fn(args, kwargs) -> str | None`: enqueueing while a job of this
    task on this backend with that key is queued or running returns that job's result instead of
    a second job (stored as TASK_KEY, so it never meets another task's, another backend's or a
    plain job's key);
    timeout: the attempt's execution timeout, as `@handler(timeout=...)`: past it the attempt
    fails ("exceeded the task timeout of N s"), its worker is replaced, and the task is retried.
    """

    lease_seconds: float | None = None
    max_attempts: int | None = None
    unique_key: UniqueKey = None
    timeout: float | None = None


def _options(task: Task) -> tuple[float | None, int | None, UniqueKey, float | None]:
    return (
        getattr(task, "lease_seconds", None),
        getattr(task, "max_attempts", None),
        getattr(task, "unique_key", None),
        getattr(task, "timeout", None),
    )


class PalisadeBackend(BaseTaskBackend):
    """TASKS = {"default": {"BACKEND": "jobs.tasks.PalisadeBackend", "QUEUES": [...]}}."""

    task_class = PalisadeTask
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    # Coroutine tasks run in the worker through Task.call (asgiref's async_to_sync), with the
    # same lease, heartbeats and fenced commit (tests/tasks/test_execution.py).
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        """Django's base makes `set(QUEUES)`: a string would be its letters (every task on the
        queue it names refused as outside them) and a number a TypeError; a name that is not
        text would fail the checks. Refused here, naming the setting (InvalidTaskBackend)."""
        queues = params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
        if not isinstance(queues, list | tuple | set | frozenset) or not all(
            isinstance(name, str) for name in queues
        ):
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names, not "
                f"{repr(queues)[:100]}"
            )
        super().__init__(alias, params)

    def validate_task(self, task: Task) -> None:
        """Django's checks (module-level function, context argument, priority -100..100, queue
        in QUEUES, aware run_after), then Palisade's: a queue name a job can carry (whatever
        QUEUES says), the module path a storable kind no plain handler holds, and the options
        within the bounds `@handler` enforces."""
        # Before Django's own checks, which compare and convert these as they come (a NaN or
        # text priority, a timedelta run_after: ValueError, TypeError, AttributeError) and let
        # a whole float or a bool through to be refused by every enqueue (jobs.InvalidOption).
        if not isinstance(task.priority, int) or isinstance(task.priority, bool):
            raise InvalidTask(
                f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
                f"{TASK_MAX_PRIORITY} (an int, not {type(task.priority).__name__})."
            )
        if task.run_after is not None and not isinstance(task.run_after, datetime):
            raise InvalidTask(
                f"run_after must be an aware datetime, not {type(task.run_after).__name__}."
            )
        # Django checks a queue only against QUEUES, and an empty QUEUES allows any: a name no
        # job can carry (or not text: a list was a TypeError) would pass, and every enqueue fail.
        if not isinstance(task.queue_name, str) or not QUEUE_NAME.match(task.queue_name):
            raise InvalidTask(
                f"queue_name {repr(task.queue_name)[:100]} must match {QUEUE_NAME.pattern}."
            )
        super().validate_task(task)
        if task.run_after is not None:
            if not timezone.is_aware(task.run_after):
                raise InvalidTask("run_after must be an aware datetime.")
            try:
                bounds.run_at(task.run_after)
            except InvalidOption as exc:
                raise InvalidTask(f"run_after: {exc}") from None
        if not KIND.match(task.module_path):
            raise InvalidTask(
                f"the task's module path {task.module_path!r} must match {KIND.pattern} "
                "(it names the job kind)"
            )
        lease_seconds, max_attempts, unique_key, timeout = _options(task)
        try:
            if lease_seconds is not None:
                bounds.lease_seconds(lease_seconds)
            if max_attempts is not None:
                bounds.max_attempts(max_attempts)
            if timeout is not None:
                bounds.number_in("timeout", timeout, TIMEOUT_SECONDS, integer=False)
        except InvalidOption as exc:
            raise InvalidTask(str(exc)) from None
        if unique_key is not None and not isinstance(unique_key, str) and not callable(unique_key):
            raise InvalidTask("unique_key must be a string or a function of (args, kwargs)")
        try:
            execution.register(task, lease_seconds, max_attempts, timeout)
        except HandlerAlreadyRegistered as exc:  # a plain @handler holds the module path
            raise InvalidTask(f"the task's module path names a kind: {exc}") from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the task's job inside the caller's transaction; return its READY result.

        task_enqueued is sent once the caller's transaction commits (at once in autocommit); a
        duplicate (the task's `unique_key` held by a live job of it) returns that job's result
        and sends nothing; a key held by a row planted with it raises UniqueKeyHeld. Arguments
        the task's function would refuse raise TypeError (`check_arguments`), nothing written.
        """
        self.validate_task(task)
        try:
            what = "a task argument"
            args, kwargs = normalized(list(args), what), normalized(dict(kwargs), what)
        except InvalidPayload:  # two keys that are one once stored (b"k" and "k")
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(f"task arguments must be JSON: {exc}") from None
        except RecursionError:  # normalized() recurses: nested past Python's limit, or a cycle
            depth = bounds.JSON_DEPTH
            raise InvalidPayload(
                f"task arguments are nested deeper than {depth} levels (or hold a cycle)"
            ) from None
        check_arguments(task, args, kwargs)
        lease_seconds, max_attempts, unique_key, _ = _options(task)
        if callable(unique_key):
            unique_key = unique_key(args, kwargs)
        unique_key = stored_key(self.alias, task, unique_key)
        run_after = task.run_after
        payload = {
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
            "run_after": run_after.isoformat() if run_after is not None else None,
        }
        job = Job.objects.enqueue(
            task.module_path,
            payload,
            queue=task.queue_name,
            priority=task.priority,
            run_at=run_after,
            max_attempts=max_attempts,
            lease_seconds=lease_seconds,
            unique_key=unique_key,
        )
        if getattr(job, "duplicate", False):
            return self._held(task, job)
        result = results.build(task, _row(job), [])
        transaction.on_commit(lambda: execution.send_robustly(task_enqueued, self, result))
        return result

    def _held(self, task: Task, holder: Job) -> TaskResult:
        """The result of the live job holding the task's stored key: a job of this task on this
        backend, unless a row was planted with that key (UniqueKeyHeld, naming it)."""
        try:
            result = self.get_result(str(holder.pk))
        except TaskResultDoesNotExist as exc:
            reason = str(exc)
        else:
            if result.task.func == task.func:
                return result
            reason = f"it is a {result.task.module_path} task"
        raise UniqueKeyHeld(
            f"unique_key {holder.unique_key!r} is held by live job {holder.pk} ({holder.kind}), "
            f"not a {task.module_path} task of backend {self.alias!r}: {reason}"
        )

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """OPTIONS, which are not read (jobs.W032); queue names a job can carry (jobs.E030),
        served by this process's workers when JOBS["QUEUES"] limits them (jobs.W031: such a task
        would wait for ever here)."""
        messages: list[CheckMessage] = []
        if self.options:
            messages.append(
                Warning(
                    f"TASKS[{self.alias!r}]['OPTIONS'] {sorted(map(str, self.options))} are not "
                    "read: a task's options go in @task(...), the engine's in JOBS",
                    id="jobs.W032",
                )
            )
        try:
            served = jobs_settings().QUEUES
        except ValueError:  # a JOBS value out of range: jobs.E001 says which, not a traceback
            served = None
        for queue in sorted(self.queues):
            if not QUEUE_NAME.match(queue):
                messages.append(
                    Error(
                        f"TASKS[{self.alias!r}] queue {queue!r} must match {QUEUE_NAME.pattern}",
                        id="jobs.E030",
                    )
                )
            elif served is not None and queue not in served:
                messages.append(
                    Warning(
                        f"TASKS[{self.alias!r}] queue {queue!r} is not in JOBS['QUEUES'] "
                        f"{list(served)}: this process's workers never run its tasks",
                        id="jobs.W031",
                    )
                )
        return messages

    def get_result(self, result_id: Any) -> TaskResult:
        """The task's result as the job tables say now; TaskResultDoesNotExist otherwise (its
        subclass jobs.tasks.MalformedTask for a task's row whose payload is not a task's)."""
        job_id = result_job_id(result_id)
        read = results.read(job_id) if 0 < job_id < 2**63 else None
        if read is None:
            raise TaskResultDoesNotExist(result_id)
        job, attempts = read
        task = execution.task_for(job["kind"])
        # A row of a task's kind whose payload is not a task's: results.MalformedTask, a
        # TaskResultDoesNotExist naming what is wrong (never a TypeError from deep inside). A
        # row without "backend" (Job.objects.create, SQL) is the task's own backend's, as the
        # worker that runs it says (results.as_enqueued).
        if task is None or results.backend_of(task, results.task_payload(job)) != self.alias:
            raise TaskResultDoesNotExist(f"job {job_id} is not a task of backend {self.alias!r}")
        return results.build(task, job, attempts)


def check_arguments(task: Task, args: list[Any], kwargs: dict[str, Any]) -> None:
    """TypeError, naming the task, if its function would refuse these arguments (too many or too
    few, an unknown or repeated keyword): the worker calls it with exactly these, so every attempt
    would fail. A function whose signature cannot be read takes any, as before."""
    signature = _signature(task.func)
    if signature is None:
        return
    try:  # with takes_context the worker passes the context first: a placeholder stands for it
        signature.bind(*([None] if task.takes_context else []), *args, **kwargs)
    except TypeError as exc:  # also a keyword that is not text ("keywords must be strings")
        try:  # a default's repr() is user code, and may raise
            parameters = str(signature.replace(return_annotation=inspect.Signature.empty))[:200]
        except Exception:  # noqa: BLE001
            parameters = "(...)"
        raise TypeError(
            f"task {task.module_path}{parameters} cannot take these arguments: {exc} "
            "(nothing was enqueued)"
        ) from None


@functools.lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    """The signature Python binds a call of `func` to, read once per function; None for one it
    cannot read (a builtin). Not the one `functools.wraps` points to: a decorator's wrapper may
    take other arguments than the function it wraps (one it injects), and the wrapper is called."""
    try:
        return inspect.signature(func, follow_wrapped=False, **_LAZY_ANNOTATIONS)
    except Exception:  # noqa: BLE001  NameError, AttributeError...: what reading it raised
        return None


# The annotations are not needed, only the parameters: from Python 3.14 (PEP 649) reading them
# as values evaluates them, and a name imported only for type checkers (`if TYPE_CHECKING:`) is
# a NameError -- a valid task refused at every enqueue. Django reads signatures so too.
_LAZY_ANNOTATIONS: dict[str, Any] = {}
if sys.version_info >= (3, 14):
    import annotationlib

    _LAZY_ANNOTATIONS["annotation_format"] = annotationlib.Format.FORWARDREF


def result_job_id(result_id: Any) -> int:
    """The job id a TaskResult.id names: the id itself, as an int or its decimal text (what
    TaskResult.id holds); anything else -- 5.7, True, "5.0", " 5" -- names no result."""
    if isinstance(result_id, int) and not isinstance(result_id, bool):
        return result_id
    if isinstance(result_id, str) and result_id.isascii() and result_id.isdecimal():
        return int(result_id) if len(result_id) <= 20 else 0
    raise TaskResultDoesNotExist(result_id)


def stored_key(alias: str, task: Task, key: Any) -> str | None:
    """The unique key a task's job stores, TASK_KEY (None: no key). A plain job stores its key as
    given, so the prefix keeps a task's key from meeting another task's, another backend's or a
    plain job's (it is what the admin, the dashboard and `manage.py jobs` show and search).
    Bounded like any unique_key: 200 characters in all."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidOption(f"unique_key must be a string, not {type(key).__name__}")
    bounds.storable_text("unique_key", key, bounds.TEXT_CHARS)  # empty, NUL, lone surrogates
    stored = f"task:{alias}:{task.module_path}:{key}"
    if len(stored) > bounds.TEXT_CHARS:
        raise InvalidOption(
            f"unique_key is stored as {TASK_KEY}, here {len(stored)} characters; "
            f"the limit is {bounds.TEXT_CHARS}"
        )
    return stored


def _row(job: Job) -> dict[str, Any]:
    row = {name: getattr(job, name) for name in results.JOB_FIELDS}
    row["id"] = job.pk
    row["created_at"] = job.created_at if isinstance(job.created_at, datetime) else None
    row["finished_at"] = None
    return row


execution.backend_classes.add(PalisadeBackend)
