"""What a task's `TaskResult` says, read from the job row and its attempts -- nothing else.

Owns: mapping a Palisade job onto Django's `TaskResult` (status, times, errors, worker_ids,
return value) and the exceptions that name failures Palisade recorded without a Python
traceback. Never: writes, or keeps a copy of a result anywhere but the job tables -- a result is
re-read each time it is asked for, so it can never disagree with what the fence decided.

The mapping (docs/tasks.md):

- status: queued -> READY (also between retries), running -> RUNNING, succeeded -> SUCCESSFUL,
  failed and cancelled -> FAILED (a cancelled job's last error is `TaskCancelled`);
- enqueued_at: the row's created_at; started_at: the first claim that ran; last_attempted_at:
  the latest; finished_at: the job's finished_at;
- worker_ids: one `<hostname>:<pid>` per claim that ran, in order (`attempts`, and a running
  task's `context.attempt`): a claim handed back unstarted (released, never confirmed running)
  ran nothing, though the fencing attempt counts it;
- errors: one TaskError per attempt that ended without success -- a raised exception (its class
  path and traceback, as the worker stored them), an expired lease (`LeaseExpired`), a lost lease
  or rejected write (`jobs.LeaseLost`) -- in attempt order; an attempt handed back unstarted
  (released) or still running is no error.

Hazard: a row is not trusted to be a task's because its kind names one -- `jobs.enqueue()`, the
admin or raw SQL can plant any payload under a task's module path. `build` checks the payload's
shape first and raises `MalformedTask` (a `TaskResultDoesNotExist`, the one error Django's
get_result contract names for "no such result") rather than a TypeError or ValueError from deep
inside.
"""

import json
import re
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from django.db.models import TextField
from django.db.models.functions import Cast
from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils import timezone

from jobs.core.exceptions import JobsError, LeaseLost
from jobs.core.states import AttemptOutcome, EventType, JobState
from jobs.models import Attempt, Job, JobEvent


class TaskCancelled(JobsError):
    """An operator cancelled the job (admin, `manage.py jobs cancel`)."""


class LeaseExpired(JobsError):
    """The attempt's worker stopped heartbeating (killed, stalled or cut off); its lease ran out
    and the reaper reclaimed the job."""


class AttemptFailed(JobsError):
    """A failure Palisade recorded without a Python traceback (e.g. a payload that could not be
    decoded, or a row the database refused to claim)."""


class MalformedTask(JobsError, TaskResultDoesNotExist):
    """A job of a task's kind whose payload is not a task's (planted by `jobs.enqueue()`, the
    admin or SQL): not an object, or `args` not a list, `kwargs` not an object, `run_after` not
    an aware ISO datetime, `backend` not text. It has no TaskResult: `get_result()` raises this
    (a TaskResultDoesNotExist, so callers of Django's API need nothing new), a worker fails the
    attempt with it, and no task_started or task_finished is sent for it."""


@dataclass(frozen=True, slots=True)
class TaskPayload:
    """A job's payload, checked to be a task's: `{"args", "kwargs", "backend", "run_after"}`."""

    args: list[Any]
    kwargs: dict[str, Any]
    backend: str | None  # None: absent (the task's own backend is meant)
    run_after: datetime | None


def task_payload(job: dict[str, Any]) -> TaskPayload:
    """The job's payload as a task's, or MalformedTask saying what is wrong with it. `args`,
    `kwargs` and `run_after` may be absent (no arguments, no deferral); present, they must have
    the type enqueue writes."""
    payload = job["payload"]

    def malformed(what: str) -> MalformedTask:
        return MalformedTask(f"job {job['id']} ({job['kind']}) is not a well-formed task: {what}")

    if isinstance(payload, Undecodable):
        raise malformed(f"its payload cannot be decoded ({payload.why})")
    if not isinstance(payload, dict):
        raise malformed(f"its payload is {type(payload).__name__}, not an object")
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    backend, run_after = payload.get("backend"), payload.get("run_after")
    if not isinstance(args, list):
        raise malformed(f"args is {type(args).__name__}, not a list")
    if not isinstance(kwargs, dict):
        raise malformed(f"kwargs is {type(kwargs).__name__}, not an object")
    if backend is not None and not isinstance(backend, str):
        raise malformed(f"backend is {type(backend).__name__}, not text")
    if run_after is None:
        return TaskPayload(args, kwargs, backend, None)
    if not isinstance(run_after, str):
        raise malformed(f"run_after is {type(run_after).__name__}, not an ISO datetime")
    try:
        when = datetime.fromisoformat(run_after)
    except ValueError:
        when = None
    if when is None or not timezone.is_aware(when):
        raise malformed(f"run_after {run_after[:40]!r} is not an aware ISO datetime")
    return TaskPayload(args, kwargs, backend, when)


STATUS = {
    JobState.QUEUED: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}
JOB_FIELDS = ("id", "kind", "state", "payload", "priority", "queue", "result", "error")
TIME_FIELDS = ("created_at", "finished_at")
JSON_FIELDS = ("payload", "result")  # re-read as text when the ORM cannot decode a row (read)
_AS_TEXT = "__as_text"
ATTEMPT_FIELDS = ("number", "worker", "claimed_at", "outcome", "error", "running_confirmed_at")
_LOST = {AttemptOutcome.LOST, AttemptOutcome.REJECTED}
_RELEASED = AttemptOutcome.RELEASED  # handed back: unstarted, unless confirmed running first
# The line Python's traceback module prints for the final exception: "pkg.mod.Class: message".
_TRACEBACK = "Traceback (most recent call last):"
_CLASS = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
# The note a task's exception gets in the worker (`mark_raised`): the last line of its traceback
# (after the message and any note of its own), or of its block in an exception group ("  | ").
RAISED = "task raised "
# A path is anything up to ':' or a space: a class defined in a function is `mod.f.<locals>.E`.
_RAISED = re.compile(r"^(?:  \| )?task raised ([A-Za-z_][^\s:]*)(?::|$)")
_NOTE_CHARS = 200


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def mark_raised(exc: BaseException) -> None:
    """Name `exc`'s class in a note, `task raised <class path>: <first line of its message>`.

    Python prints an exception's notes after its message, so the worker's stored traceback ends
    with this line, which no message can forge: a message is data (a remote service's error body,
    a user's input) and may hold lines that look like a traceback of something else entirely.
    """
    try:  # cut at every line boundary the reader splits at (\r, \x0b, \u2028...), not only \n
        first = (str(exc)[:_NOTE_CHARS].splitlines() or [""])[0]  # cut first: a huge message
    except Exception:  # noqa: BLE001  a raising __str__: the class alone
        first = ""
    path = re.sub(r"[\s:]", "?", _path(type(exc)))  # a qualname is any text: one token here
    note = RAISED + path + (f": {first}" if first else "")
    try:  # its own code: a `__notes__` property, or a `__getattr__` raising KeyError, may raise
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list) and notes[-1:] == [note]:
            return  # the same exception object raised again (a later attempt in this process)
    except Exception:  # noqa: BLE001  then it is noted below if it can be (else formatted bare)
        pass
    try:
        BaseException.add_note(exc, note)  # never a class's own add_note
    except Exception:  # noqa: BLE001  `__notes__` set to something else than a list
        try:
            exc.__notes__ = [note]
        except Exception:  # noqa: BLE001  a class that forbids it: the text is parsed as is
            pass


def exception_class_path(error: str) -> str | None:
    """The class path of the exception an attempt's error text names, or None.

    A task's exception names itself on the last line of its block (`mark_raised`): the last such
    line is the one read. Text without it (written before that line existed, or an error that did
    not come from a task's code) is read as Python formats a traceback: the final (outermost)
    exception is printed last, and its first line after the frames is `module.Qualname: message`
    (bare `Qualname` for builtins); that reading can be misled by a message holding a traceback.
    """
    lines = error.splitlines()
    marked = [m.group(1) for m in map(_RAISED.match, lines) if m is not None]
    if marked:
        return marked[-1]
    starts = [i for i, line in enumerate(lines) if line == _TRACEBACK]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if line.startswith((" ", "\t")):
            continue  # a frame, its source line or its carets
        match = _CLASS.match(line)
        if match is None:
            return None
        name = match.group(1)
        return name if "." in name else f"builtins.{name}"
    return None


def _attempt_error(attempt: dict[str, Any]) -> TaskError | None:
    outcome, text = attempt["outcome"], attempt["error"] or ""
    where = f"attempt {attempt['number']} on {attempt['worker']}"
    if outcome == AttemptOutcome.FAILED:
        path = exception_class_path(text) or _path(AttemptFailed)
        return TaskError(exception_class_path=path, traceback=text or f"{where} failed")
    if outcome == AttemptOutcome.EXPIRED and attempt.get("worker_exited"):
        return TaskError(  # rescued: qcluster saw the worker process dead (jobs.worker.rescue)
            exception_class_path=_path(LeaseExpired),
            traceback=f"{where}: its worker process died (seen exited by its cluster, e.g. "
            "killed) and the job was reclaimed at once",
        )
    if outcome == AttemptOutcome.EXPIRED:
        return TaskError(
            exception_class_path=_path(LeaseExpired),
            traceback=f"{where}: its lease expired (the worker stopped heartbeating: killed, "
            "stalled or cut off) and the job was reclaimed",
        )
    if outcome in _LOST:
        return TaskError(
            exception_class_path=_path(LeaseLost),
            traceback=f"{where}: the lease was lost to a newer attempt; its work was discarded "
            f"({outcome})",
        )
    return None


def _errors(job: dict[str, Any], attempts: list[dict[str, Any]]) -> list[TaskError]:
    errors = [e for e in map(_attempt_error, attempts) if e is not None]
    if job["state"] == JobState.CANCELLED:
        errors.append(
            TaskError(
                exception_class_path=_path(TaskCancelled),
                traceback="the job was cancelled by an operator"
                + (f": {job['error']}" if job["error"] else ""),
            )
        )
    elif job["state"] == JobState.FAILED and not errors:
        # Failed without a failed attempt of its own (refused by the database at claim time).
        errors.append(
            TaskError(exception_class_path=_path(AttemptFailed), traceback=job["error"] or "")
        )
    return errors


def backend_of(task: Task, payload: TaskPayload) -> str:
    """The alias of the backend a task's row belongs to: its payload's, else (a row written
    without one: Job.objects.create, SQL) the task's own."""
    return payload.backend if payload.backend is not None else task.backend


def as_enqueued(task: Task, job: dict[str, Any], payload: TaskPayload) -> Task:
    """The task as it was enqueued (priority, queue, run_after) without validating it again: a
    result stays readable after the settings changed."""
    values = {f.name: getattr(task, f.name) for f in fields(task)}
    values.update(
        priority=job["priority"],
        queue_name=job["queue"],
        run_after=payload.run_after,
        backend=backend_of(task, payload),
    )
    variant = object.__new__(type(task))
    for name, value in values.items():
        object.__setattr__(variant, name, value)
    return variant


def build(task: Task, job: dict[str, Any], attempts: list[dict[str, Any]]) -> TaskResult:
    """The TaskResult of `job` (a dict of JOB_FIELDS + TIME_FIELDS) and its attempts;
    MalformedTask if its payload is not a task's."""
    payload = task_payload(job)
    enqueued = as_enqueued(task, job, payload)
    ran = [a for a in attempts if a["outcome"] != _RELEASED or a["running_confirmed_at"]]
    claims = [a["claimed_at"] for a in ran]
    try:  # Django normalises the arguments recursively: a row's may be nested past the limit
        result: TaskResult = TaskResult(
            task=enqueued,
            id=str(job["id"]),
            status=STATUS[job["state"]],
            enqueued_at=job["created_at"],
            started_at=claims[0] if claims else None,
            last_attempted_at=claims[-1] if claims else None,
            finished_at=job["finished_at"],
            args=list(payload.args),
            kwargs=dict(payload.kwargs),
            backend=enqueued.backend,
            errors=_errors(job, attempts),
            worker_ids=[a["worker"] for a in ran],
        )
    except RecursionError:  # json's limit is not Python's: decoded, yet too deep to normalise
        raise MalformedTask(f"job {job['id']} ({job['kind']}): arguments nested too deep") from None
    if job["state"] == JobState.SUCCEEDED:
        if isinstance(job["result"], Undecodable):
            raise MalformedTask(
                f"job {job['id']} ({job['kind']}): its result cannot be decoded "
                f"({job['result'].why})"
            )
        object.__setattr__(result, "_return_value", job["result"])
    return result


def read(job_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The job's row and its attempts in claim order, or None if there is no such job.

    One query for a job that was claimed (its attempts joined to its row: what a running task
    reads for task_started), two for one never claimed.
    """
    try:
        return _read(job_id, as_text=False)
    except (ValueError, RecursionError):  # JSON Python cannot decode: that row's problem alone
        return _read(job_id, as_text=True)


def _read(job_id: int, *, as_text: bool) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    plain, texts = _job_columns("job__", as_text=as_text)
    rows = list(
        Attempt.objects.filter(job_id=job_id)
        .order_by("number")
        .values(*ATTEMPT_FIELDS, *plain, **texts)
    )
    if rows:
        job = _decoded({name[len("job__") :]: rows[0][name] for name in (*plain, *texts)})
        attempts = [{name: row[name] for name in ATTEMPT_FIELDS} for row in rows]
        _mark_exited({job_id: (job, attempts)})
        return job, attempts
    plain, texts = _job_columns(as_text=as_text)
    job = Job.objects.filter(pk=job_id).values(*plain, **texts).first()
    return (_decoded(job), []) if job is not None else None


def read_many(job_ids: list[int]) -> dict[int, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """`read` for many jobs in two queries (the task_finished thread sends in batches)."""
    try:
        jobs = _read_jobs(job_ids, as_text=False)
    except (ValueError, RecursionError):  # one row's JSON: it must cost no other job its notice
        jobs = _read_jobs(job_ids, as_text=True)
    attempts = Attempt.objects.filter(job_id__in=list(jobs)).order_by("job_id", "number")
    for row in attempts.values("job_id", *ATTEMPT_FIELDS):
        jobs[row.pop("job_id")][1].append(row)
    _mark_exited(jobs)
    return jobs


def _mark_exited(jobs: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]]) -> None:
    """Set `worker_exited` on each expired attempt whose `expired` event says its worker process
    was seen dead (a rescue, not a lease that ran out). One query, only if any attempt expired."""
    expired = {
        (job_id, a["number"]): a
        for job_id, (_, attempts) in jobs.items()
        for a in attempts
        if a["outcome"] == AttemptOutcome.EXPIRED
    }
    if not expired:
        return
    events = JobEvent.objects.filter(
        job_id__in={job_id for job_id, _ in expired},
        type=EventType.EXPIRED,
        data__worker_exited=True,
    )
    for key in events.values_list("job_id", "attempt"):
        if key in expired:
            expired[key]["worker_exited"] = True


def _read_jobs(
    job_ids: list[int], *, as_text: bool
) -> dict[int, tuple[dict[str, Any], list[dict[str, Any]]]]:
    plain, texts = _job_columns(as_text=as_text)
    rows = Job.objects.filter(pk__in=job_ids).values(*plain, **texts)
    return {row["id"]: (_decoded(row), []) for row in rows}


# -- JSON columns Python cannot decode --------------------------------------------------------
# A row written by SQL may hold JSON the database stores and Python cannot decode (a number of
# 5,001 digits, nesting past the recursion limit). Decoded by the ORM, it fails the whole query:
# a batch of task_finished notices, or get_result with a ValueError from inside. So a query that
# fails that way is made again with the JSON columns read as text and decoded row by row: such a
# row is its own problem (MalformedTask, saying why), and the usual read costs nothing more.


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A JSON column of a job's row that Python cannot decode, and why."""

    why: str


def _job_columns(prefix: str = "", *, as_text: bool) -> tuple[list[str], dict[str, Cast]]:
    names = (*JOB_FIELDS, *TIME_FIELDS)
    if not as_text:
        return [prefix + n for n in names], {}
    plain = [prefix + n for n in names if n not in JSON_FIELDS]
    return plain, {prefix + n + _AS_TEXT: Cast(prefix + n, TextField()) for n in JSON_FIELDS}


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    for name in JSON_FIELDS:
        if name + _AS_TEXT not in row:
            continue  # decoded by the ORM
        text = row.pop(name + _AS_TEXT)
        try:
            row[name] = None if text is None else json.loads(text)
        except (ValueError, RecursionError) as exc:
            row[name] = Undecodable(f"{type(exc).__name__}: {str(exc)[:200]}")
    return row
