"""How a `@task` runs: as the handler of the kind named by its module path, on the fenced runner.

Owns: the kinds of tasks (module path -> the Task a Palisade backend validated), the handler that
runs one (`fn(ctx)`: task_started, then the task's function with its args, kwargs and -- with
takes_context -- a TaskContext carrying the JobContext; a return value that cannot be stored is
UnencodableResult, a permanent failure the runner does not retry), the resolver that lets a
worker learn a kind whose module it has not imported yet, and the thread that sends
task_finished once the final write has landed.

Why the runner side lives here and not in jobs.worker: the worker runs any handler the registry
holds and knows nothing of django.tasks; a task is registered as one more handler (leases,
heartbeats, fenced commit, retries with backoff, max_attempts, hand-back at shutdown all come
from the runner unchanged). The web process imports this module too (the backend registers a
task when it validates it, so enqueue knows the kind), so it must not import jobs.worker
(import-linter: jobs.tasks sits between the worker and jobs.context).

Never: runs anything that is not a django.tasks `Task` validated by a Palisade backend. A kind
read from a row is never imported and called: the resolver may import the *module* part of an
unknown kind only when it lies inside an installed app, and only a Task that module's import
registered (by validation through a Palisade backend) is ever run.

Hazards: signal receivers are user code. task_started runs in the handler (a raising receiver is
logged, `send_robust`); task_finished runs on a thread of its own, so a slow receiver delays
neither a commit nor a heartbeat, and is sent only after the commit or final failure landed --
never for a zombie's rejected write (the worker calls the hook after the write, see
jobs.core.registry.finished). That thread is per process and daemonic, so a process that ends
waits for it, up to EXIT_WAIT_SECONDS and no longer (a stuck receiver must not keep a process
alive): at its normal end (a guard thread, not daemonic, waits once the main thread is over) and
before an os._exit of the worker or of qcluster's main process (`send_queued_before_exit`, an
exit hook of jobs.core.registry). A notice still queued past that bound, or in a process killed,
is not sent (signals are in-process notices, never the truth; `get_result()` is).
"""

import asyncio
import logging
import os
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.apps import apps
from django.db import connection
from django.tasks import task_backends
from django.tasks.base import Task, TaskContext
from django.tasks.signals import task_enqueued, task_finished, task_started

from jobs.context import JobContext
from jobs.core import bounds, registry
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import JobsError, PermanentFailure, UnknownKind
from jobs.tasks import results
from jobs.tasks.normalized import normalized

logger = logging.getLogger("jobs.tasks")

# module path -> the Task a Palisade backend validated (the decorated one, or a copy: one func).
_tasks: dict[str, Task] = {}
_adapters: dict[str, registry.HandlerFn] = {}
# Kinds the resolver looked for in vain, least recently asked first; the oldest is forgotten past
# MAX_MISSES (asked again, it is looked for again). Only names a handler could have are kept.
MAX_MISSES = 1024
_misses: OrderedDict[str, None] = OrderedDict()
_misses_lock = threading.Lock()
# Backend classes whose tasks may run here (jobs.tasks.backend adds PalisadeBackend).
backend_classes: set[type] = set()


@dataclass(frozen=True, slots=True, kw_only=True)
class PalisadeTaskContext(TaskContext):  # type: ignore[misc]
    """Django's TaskContext, plus `job`: Palisade's JobContext of this attempt (heartbeat,
    checkpoint, stage, effect, intent, fenced_write; `job.attempt` is the fencing token)."""

    job: JobContext


class CancelledInTask(JobsError):
    """asyncio.CancelledError came out of a task's own code (its event loop is async_to_sync's,
    or it ran one itself): that task's failure, carried as an ordinary exception. Nothing cancels
    a worker that way from outside, so it must not end the drain as a stop (a BaseException) does:
    the batch's other jobs run on."""


class UnencodableResult(PermanentFailure):
    """A task returned a value that cannot be stored as its result (not JSON: a set, an object,
    NaN, bytes that are not UTF-8; nested past 64 levels; over JOBS["MAX_PAYLOAD_BYTES"]; its
    own code raising while it is read, as a plain handler's unusable result is). Every
    attempt would return it again, so the job fails at once, not retried, as Django's
    ImmediateBackend fails it once; the message names the value's type and why."""


def job_context(context: TaskContext) -> JobContext:
    """The JobContext of a task running with takes_context=True (`context.job`)."""
    if not isinstance(context, PalisadeTaskContext):
        raise TypeError("not the context of a task running on a Palisade backend")
    return context.job


def register(
    task: Task, lease_seconds: float | None, max_attempts: int | None, timeout: float | None = None
) -> None:
    """Make `task` a kind (its module path) this process can run and enqueue."""
    kind = task.module_path
    known = _tasks.get(kind)
    if known is not None and known.func is task.func:
        return
    adapter = _adapters.setdefault(kind, _adapter(kind))
    registry.handler(  # first: a plain handler's kind (HandlerAlreadyRegistered) is no task's
        kind,
        lease_seconds=lease_seconds,
        max_attempts=max_attempts,
        on_finished=_finished,
        timeout=timeout,
    )(adapter)
    _tasks[kind] = task
    with _misses_lock:
        _misses.pop(kind, None)


def task_for(kind: str) -> Task | None:
    """The Task registered for `kind`, resolving (importing its module) if need be."""
    if kind not in _tasks:
        resolve(kind)
    return _tasks.get(kind)


def resolve(kind: str) -> None:
    """Import the module of an unknown task kind, if it lies inside an installed app.

    Importing it registers its tasks (a Task is validated, hence registered, when it is made).
    Never imports anything outside the installed apps' packages, never calls what it imports.
    """
    if not isinstance(kind, str) or not registry.KIND.match(kind) or "." not in kind:
        return  # no task's module path: nothing to import, nothing to remember
    if kind in _tasks or _missed(kind):
        return
    module = kind.rsplit(".", 1)[0]
    inside = any(
        module == app.name or module.startswith(app.name + ".") for app in apps.get_app_configs()
    )
    if inside:
        try:
            import_module(module)
        # A broken module is that kind's problem: unknown. So is one that calls sys.exit() when
        # imported (a script's): the registry's resolvers never raise, and this one is asked in
        # the middle of a worker's batch, before any job of it has started.
        except (Exception, SystemExit):  # noqa: BLE001
            logger.exception("could not import %s to find task %s", module, kind)
    if kind not in _tasks:
        with _misses_lock:
            _misses[kind] = None
            while len(_misses) > MAX_MISSES:
                _misses.popitem(last=False)


def _missed(kind: str) -> bool:
    with _misses_lock:
        if kind not in _misses:
            return False
        _misses.move_to_end(kind)
        return True


registry.add_resolver(resolve)


def _backend(alias: str) -> Any:
    backend = task_backends[alias]
    if not isinstance(backend, tuple(backend_classes)):
        raise UnknownKind(f"task backend {alias!r} is not a Palisade backend")
    return backend


def _adapter(kind: str) -> registry.HandlerFn:
    def run_task(ctx: JobContext) -> Any:
        try:
            return _run(kind, ctx)
        except asyncio.CancelledError as exc:
            results.mark_raised(exc)  # its TaskError names CancelledError, the cause
            raise CancelledInTask(f"{kind} was cancelled by its own code") from exc
        except BaseException as exc:
            results.mark_raised(exc)  # the class its TaskError names, which no message can forge
            raise

    # Named after the task: the kind's code lives in the task's module, which is where the
    # registry (HandlerAlreadyRegistered, tests/unit/test_layout.py) says a kind comes from.
    run_task.__qualname__ = run_task.__name__ = f"task:{kind}"
    run_task.__module__ = kind.rsplit(".", 1)[0]
    return run_task


def _run(kind: str, ctx: JobContext) -> Any:
    task = _tasks.get(kind)
    if task is None or not isinstance(task, Task):
        raise UnknownKind(f"{kind} is not a django.tasks Task of a Palisade backend")
    read = results.read(ctx.job_id)
    if read is None:  # deleted under us: nothing to report to
        raise UnknownKind(f"job {ctx.job_id} no longer exists")
    result = results.build(task, *read)  # a payload that is not a task's: MalformedTask
    backend = _backend(result.backend)
    send_robustly(task_started, backend, result)
    args, kwargs = result.args, result.kwargs
    if task.takes_context:
        value = task.call(PalisadeTaskContext(task_result=result, job=ctx), *args, **kwargs)
    else:
        value = task.call(*args, **kwargs)
    return encodable(kind, value)


def encodable(kind: str, value: Any) -> Any:
    """`value` as Django normalises a result (tuples become lists), checked as the runner will
    store it; UnencodableResult if it cannot be. Only this task's attempt fails: the runner
    writes each job's failure on its own, and its batch-mates run and commit."""
    try:
        plain = normalized(value, "the value")
        bounds.json_value(plain, jobs_settings().MAX_PAYLOAD_BYTES, what="the value")
        return plain
    except (TypeError, ValueError) as exc:  # jobs.InvalidPayload is a ValueError
        why = _text(exc)
    except RecursionError:  # normalized() recurses: nested past Python's limit, or a cycle
        why = f"it is nested deeper than {bounds.JSON_DEPTH} levels (or holds a cycle)"
    except Exception as exc:  # noqa: BLE001  the value's own code (a Mapping's items()) raised
        why = f"{type(exc).__name__}: {_text(exc)}"  # as a plain handler's: not retried either
    name = _text(type(value).__qualname__)[:100]
    raise UnencodableResult(
        f"{kind} returned a value of type {name}, which cannot be encoded as its JSON result: "
        f"{why[:300]}"
    )


def _text(value: object) -> str:
    """One printable line of `str(value)` (its own __str__ may raise: then its class)."""
    try:
        text = str(value)[:1000]
    except Exception:  # noqa: BLE001
        text = type(value).__name__
    return "".join(c if c.isprintable() else "?" for c in text)


_SIGNAL_NAMES = {
    task_enqueued: "task_enqueued",
    task_started: "task_started",
    task_finished: "task_finished",
}


def send_robustly(signal: Any, backend: Any, result: Any) -> None:
    """Send `signal` as Django does; a receiver that raises is logged (naming the signal)
    and changes nothing. A SystemExit too (a library calling sys.exit()), which Django's
    send_robust lets through: it would end a worker's drain (task_started) or the notice thread
    with its batch (task_finished). Then the receivers after it are not called."""
    try:
        answers = signal.send_robust(sender=type(backend), task_result=result)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001  a receiver's: never a stop of this process
        answers = [(None, exc)]
    for _receiver, answer in answers:
        if isinstance(answer, BaseException):
            logger.error(
                "task %s (job %s): a receiver of %s raised %r; the task's outcome is unchanged",
                result.task.module_path,
                result.id,
                _SIGNAL_NAMES.get(signal, repr(signal)),
                answer,
            )


# -- task_finished, after the final write landed ---------------------------------------------

_finished_queue: "queue.Queue[int]" = queue.Queue()
FINISHED_BATCH = 200  # jobs read (in two queries) and announced together
# How long a process that ends waits, at most, for the task_finished notices it queued: ample for
# the two reads and ordinary receivers (milliseconds), and short enough that a stuck receiver
# delays a worker's exit -- or a timed-out worker's replacement -- by this much only.
EXIT_WAIT_SECONDS = registry.EXIT_HOOK_SECONDS
_thread_lock = threading.Lock()
_thread: threading.Thread | None = None
_exit_guard: threading.Thread | None = None


def _finished(job_id: int, attempt: int, succeeded: bool) -> None:
    """registry's on_finished hook: called by the worker after the final write landed."""
    global _thread, _exit_guard
    _finished_queue.put(job_id)
    with _thread_lock:  # threads do not survive a fork: each process starts its own
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_notify, name="jobs-task-finished", daemon=True)
            _thread.start()
        if _exit_guard is None or not _exit_guard.is_alive():
            # Not daemonic (said explicitly: a thread inherits its creator's flag, and this hook
            # is often called on the drain's daemonic background thread), so the interpreter --
            # and a django-q2 worker at its normal end -- waits for it.
            _exit_guard = threading.Thread(
                target=_at_exit, name="jobs-task-finished-exit", daemon=False
            )
            _exit_guard.start()


def _at_exit() -> None:
    """The process's main thread is over (it is ending): the notices still queued get up to
    EXIT_WAIT_SECONDS before the daemonic notice thread dies with the process."""
    threading.main_thread().join()
    send_queued_before_exit()


def _notify() -> None:
    while True:
        batch = [_finished_queue.get()]
        while len(batch) < FINISHED_BATCH and not _finished_queue.empty():
            batch.append(_finished_queue.get_nowait())
        try:
            _send_finished(batch)
        except Exception:  # noqa: BLE001  a notice lost is logged; the thread must live on
            logger.exception("jobs %s: could not send task_finished", batch)
        finally:
            for _ in batch:
                _finished_queue.task_done()
            if _finished_queue.empty():
                connection.close()  # this thread's own connection, reopened on the next burst


def _send_finished(job_ids: list[int]) -> None:
    """One task_finished per job still there, each on its own: a job whose notice cannot be
    built (a malformed row, a backend no longer configured) is logged and costs no other job of
    the batch its notice."""
    found = results.read_many(job_ids)
    for job_id in job_ids:
        if job_id not in found:
            continue  # deleted meanwhile
        job, attempts = found[job_id]
        task = task_for(job["kind"])
        if task is None:
            continue
        try:
            result = results.build(task, job, attempts)
            backend = _backend(result.backend)
        except results.MalformedTask as exc:
            logger.error("no task_finished for job %s: %s", job_id, exc)
            continue
        except Exception:  # noqa: BLE001  a notice lost is logged; the batch's others go on
            logger.exception("job %s: could not send task_finished", job_id)
            continue
        send_robustly(task_finished, backend, result)


def send_queued_before_exit(seconds: float = EXIT_WAIT_SECONDS) -> bool:
    """This process is about to end: wait up to `seconds` for the task_finished notices it
    queued (the exit guard at a normal end; registry.before_exit before an os._exit). True once
    all are sent; False, logged, if some are lost."""
    if wait_for_finished_notices(seconds):
        return True
    logger.warning(
        "process %s ends with task_finished notices unsent after %g s (a receiver slow or stuck): "
        "they are lost; get_result() reads the outcome",
        os.getpid(),
        seconds,
    )
    return False


def wait_for_finished_notices(timeout: float) -> bool:
    """True once every task_finished queued in this process was sent (tests, process exit).

    Waits on the queue's own condition, starting no thread: it runs at interpreter shutdown too,
    when no thread may be started."""
    done = _finished_queue.all_tasks_done
    with done:
        return done.wait_for(lambda: _finished_queue.unfinished_tasks == 0, timeout)


registry.add_exit_hook(send_queued_before_exit)  # before an os._exit of this process
