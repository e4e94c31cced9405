"""What a task's `TaskResult` says, read from the job row and its attempts -- nothing else.

Owns: mapping a Palisade job onto Django's `TaskResult` (status, times, errors, worker_ids,
return value) and the exceptions that name failures Palisade recorded without a Python
traceback. Never: writes, or keeps a copy of a result anywhere but the job tables -- a result is
re-read each time it is asked for, so it can never disagree with what the fence decided.

The mapping (docs/tasks.md):

- status: queued -> READY (also between retries), running -> RUNNING, succeeded -> SUCCESSFUL,
  failed and cancelled -> FAILED (a cancelled job's last error is `TaskCancelled`);
- enqueued_at: the row's created_at; started_at: the first claim; last_attempted_at: the latest
  claim; finished_at: the job's finished_at;
- worker_ids: one `<hostname>:<pid>` per claim, in order, so `attempts == len(worker_ids)` is the
  job's fencing attempt;
- errors: one TaskError per attempt that ended without success -- a raised exception (its class
  path and traceback, as the worker stored them), an expired lease (`LeaseExpired`), a lost lease
  or rejected write (`jobs.LeaseLost`) -- in attempt order; an attempt handed back unstarted
  (released) or still running is no error.
"""

import re
from dataclasses import fields
from datetime import datetime
from typing import Any

from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus

from jobs.core.exceptions import JobsError, LeaseLost
from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job


class TaskCancelled(JobsError):
    """An operator cancelled the job (admin, `manage.py jobs cancel`)."""


class LeaseExpired(JobsError):
    """The attempt's worker stopped heartbeating (killed, stalled or cut off); its lease ran out
    and the reaper reclaimed the job."""


class AttemptFailed(JobsError):
    """A failure Palisade recorded without a Python traceback (e.g. a payload that could not be
    decoded, or a row the database refused to claim)."""


STATUS = {
    JobState.QUEUED: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}
JOB_FIELDS = ("id", "kind", "state", "payload", "priority", "queue", "result", "error")
TIME_FIELDS = ("created_at", "finished_at")
ATTEMPT_FIELDS = ("number", "worker", "claimed_at", "outcome", "error")
_LOST = {AttemptOutcome.LOST, AttemptOutcome.REJECTED}
# The line Python's traceback module prints for the final exception: "pkg.mod.Class: message".
_TRACEBACK = "Traceback (most recent call last):"
_CLASS = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def exception_class_path(error: str) -> str | None:
    """The class path of the final exception in a traceback as Python formats it, or None.

    Python prints the final (outermost) exception last, and its first line after the frames is
    `module.Qualname: message` (bare `Qualname` for builtins). A message spanning lines follows
    that line, so the line read is the first unindented one after the last traceback header.
    """
    lines = error.splitlines()
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
                traceback="the job was cancelled by an operator" + _tail(job["error"]),
            )
        )
    elif job["state"] == JobState.FAILED and not errors:
        # Failed without a failed attempt of its own (refused by the database at claim time).
        errors.append(
            TaskError(exception_class_path=_path(AttemptFailed), traceback=job["error"] or "")
        )
    return errors


def _tail(error: str) -> str:
    return f": {error}" if error else ""


def as_enqueued(task: Task, job: dict[str, Any]) -> Task:
    """The task as it was enqueued (priority, queue, run_after) without validating it again: a
    result stays readable after the settings changed."""
    payload = job["payload"] if isinstance(job["payload"], dict) else {}
    run_after = payload.get("run_after")
    values = {f.name: getattr(task, f.name) for f in fields(task)}
    values.update(
        priority=job["priority"],
        queue_name=job["queue"],
        run_after=datetime.fromisoformat(run_after) if isinstance(run_after, str) else None,
        backend=payload.get("backend", task.backend),
    )
    variant = object.__new__(type(task))
    for name, value in values.items():
        object.__setattr__(variant, name, value)
    return variant


def build(task: Task, job: dict[str, Any], attempts: list[dict[str, Any]]) -> TaskResult:
    """The TaskResult of `job` (a dict of JOB_FIELDS + TIME_FIELDS) and its attempts."""
    payload = job["payload"] if isinstance(job["payload"], dict) else {}
    enqueued = as_enqueued(task, job)
    claims = [a["claimed_at"] for a in attempts]
    result: TaskResult = TaskResult(
        task=enqueued,
        id=str(job["id"]),
        status=STATUS[job["state"]],
        enqueued_at=job["created_at"],
        started_at=claims[0] if claims else None,
        last_attempted_at=claims[-1] if claims else None,
        finished_at=job["finished_at"],
        args=list(payload.get("args", [])),
        kwargs=dict(payload.get("kwargs", {})),
        backend=enqueued.backend,
        errors=_errors(job, attempts),
        worker_ids=[a["worker"] for a in attempts],
    )
    if job["state"] == JobState.SUCCEEDED:
        object.__setattr__(result, "_return_value", job["result"])
    return result


def read(job_id: int) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The job's row and its attempts in claim order, or None if there is no such job.

    One query for a job that was claimed (its attempts joined to its row: what a running task
    reads for task_started), two for one never claimed.
    """
    joined = [f"job__{name}" for name in (*JOB_FIELDS, *TIME_FIELDS)]
    rows = list(
        Attempt.objects.filter(job_id=job_id).order_by("number").values(*ATTEMPT_FIELDS, *joined)
    )
    if rows:
        job = {name[len("job__") :]: rows[0][name] for name in joined}
        return job, [{name: row[name] for name in ATTEMPT_FIELDS} for row in rows]
    job = Job.objects.filter(pk=job_id).values(*JOB_FIELDS, *TIME_FIELDS).first()
    return (job, []) if job is not None else None


def read_many(job_ids: list[int]) -> dict[int, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """`read` for many jobs in two queries (the task_finished thread sends in batches)."""
    jobs: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {
        j["id"]: (j, [])
        for j in Job.objects.filter(pk__in=job_ids).values(*JOB_FIELDS, *TIME_FIELDS)
    }
    attempts = Attempt.objects.filter(job_id__in=list(jobs)).order_by("job_id", "number")
    for row in attempts.values("job_id", *ATTEMPT_FIELDS):
        jobs[row.pop("job_id")][1].append(row)
    return jobs
