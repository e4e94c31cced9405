"""Operator actions on a selection of jobs: requeue, cancel, retry now, enqueue a copy.

Owns: applying one action to many jobs in chunks walked by a keyset cursor on `id` (ascending),
each job its own fenced transition in jobs/core/transitions (one job's refusal or error decides
nothing for the others), the report of what changed and what was skipped and why, the audit trail
in Django's LogEntry with the attempt each fence carried, and the sentence a confirmation shows
("attempt 3 is running on vm:1234; its later writes will be refused"). The admin, the dashboard
and `manage.py jobs` all call apply() or apply_chunk().

A chunk is one transaction: its transitions and its LogEntry rows commit together, so an
interrupted run (SIGINT, a killed process, a lost connection) leaves every changed job audited
and nothing half-written; the cursor (`Report.last_id`) says where to go on.

Never: writes a job itself -- jobs/core/transitions does (`Job.objects.enqueue` for a copy).
Hazards: a chunk holds the row locks of the jobs it changed until it commits (at most CHUNK_ROWS
jobs or CHUNK_SECONDS): a worker's heartbeat or commit of such a job waits that long, then is
refused; a skipped job's lock is released at once. The transitions log each change as they make
it, so a chunk rolled back by an interrupt has logged changes that did not happen (the audit and
the job tables agree; the log line is only a log line).
"""

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, transaction
from django.db.models import QuerySet

from jobs.core import transitions
from jobs.core.exceptions import EnqueueError
from jobs.core.states import JobState
from jobs.core.transitions import OperatorResult
from jobs.models import Attempt, Job

logger = logging.getLogger("jobs.actions")

MAX_ROWS = 10_000  # jobs per call of apply() by default (one admin request); the cursor goes on
CHUNK_ROWS = 500  # jobs per transaction (and per LogEntry batch) at most
CHUNK_SECONDS = 1.0  # a chunk ends after this long: the row locks it holds are held this long
PERMISSION = "jobs.change_job"
LAST_ID = 2**63 - 1  # the largest id a bigint (PostgreSQL) or an INTEGER (SQLite) holds
UNDECODABLE = "its payload cannot be decoded (JSON nested beyond Python's limit)"
UNDECODABLE_NUMBER = "its payload cannot be decoded (a number longer than Python reads)"


def enqueue_copy(job_id: int, actor: str) -> OperatorResult:
    """A new queued job with the same kind, payload, queue, priority and limits (no unique_key)."""
    try:
        with transaction.atomic():  # a savepoint: a failed read or insert spoils no chunk
            row = _copied_row(job_id)
            if isinstance(row, str):
                return OperatorResult(job_id, "copy", False, row)
            copy = Job.objects.enqueue(
                row["kind"],
                row["payload"],
                queue=row["queue"],
                priority=row["priority"],
                max_attempts=row["max_attempts"],
                lease_seconds=row["lease_seconds"],
            )
    except EnqueueError as exc:  # the kind is gone, the payload is now too large, ...
        return OperatorResult(job_id, "copy", False, f"refused by enqueue: {exc}"[:300])
    return OperatorResult(job_id, "copy", True, f"copied as job {copy.pk}", new_job_id=copy.pk)


def _copied_row(job_id: int) -> dict[str, Any] | str:
    """The columns a copy takes, or why there is none. A raw-SQL row Python cannot decode is this
    job's refusal, never the chunk's (the worker fails such a row when it claims it)."""
    columns = ("kind", "payload", "queue", "priority", "max_attempts", "lease_seconds")
    try:
        row = Job.objects.filter(pk=job_id).values(*columns).first()
    except RecursionError:  # nested past Python's limit
        return f"refused: {UNDECODABLE}"
    except ValueError:  # a number of more than 4300 digits (jsonb keeps 1e5000's every digit)
        return f"refused: {UNDECODABLE_NUMBER}"
    return "no such job" if row is None else row


ACTIONS: dict[str, Callable[[int, str], OperatorResult]] = {
    "requeue": transitions.requeue,
    "cancel": transitions.cancel,
    "retry": transitions.retry_now,
    "copy": enqueue_copy,
}


@dataclass
class Report:
    action: str
    changed: list[OperatorResult] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    not_processed: int = 0  # matched beyond the limit (after `last_id`)
    last_id: int = 0  # the cursor: every selected job with an id up to this one was processed
    more: bool = False  # selected jobs remain after `last_id`

    @property
    def processed(self) -> int:
        return len(self.changed) + sum(self.skipped.values())

    def add(self, other: "Report") -> None:
        self.changed += other.changed
        self.skipped += other.skipped
        self.last_id = max(self.last_id, other.last_id)
        self.more = other.more

    def summary(self) -> str:
        text = f"{self.action}: {len(self.changed)} changed, {sum(self.skipped.values())} skipped"
        if self.skipped:
            reasons = "; ".join(f"{n} {why}" for why, n in self.skipped.most_common())
            text += f" ({reasons})"
        if self.not_processed:
            text += (
                f"; {self.not_processed} not processed (limit per action reached; "
                f"go on after job {self.last_id})"
            )
        return text


def may_act(user: Any) -> bool:
    """Staff with the job "change" permission (superusers have it)."""
    return bool(
        getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
        and user.has_perm(PERMISSION)
    )


def _check(action: str, user: Any) -> None:
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; one of {sorted(ACTIONS)}")
    if not may_act(user):
        raise PermissionError(f"{user} may not change jobs (needs staff and {PERMISSION})")


def _next_ids(jobs: QuerySet[Job] | Iterable[int], after: int, upto: int | None, n: int) -> list:
    """The next `n` selected ids above the cursor, ascending (a keyset walk of the primary key)."""
    if isinstance(jobs, QuerySet):
        qs = jobs.filter(pk__gt=after)
        if upto is not None:
            qs = qs.filter(pk__lte=upto)
        return list(qs.order_by("id").values_list("id", flat=True)[:n])
    ids = sorted(i for i in set(jobs) if i > after and (upto is None or i <= upto))
    return ids[:n]


def apply_chunk(
    action: str,
    jobs: QuerySet[Job] | Iterable[int],
    *,
    user: AbstractBaseUser,
    via: str,
    after: int = 0,
    upto: int | None = None,
    size: int | None = None,
) -> Report:
    """Apply `action` to the next `size` selected jobs with `after < id <= upto`, in one
    transaction with their audit. `report.last_id` is the cursor of the next chunk."""
    _check(action, user)
    size = size or CHUNK_ROWS
    ids = _next_ids(jobs, after, upto, size + 1)
    report = Report(action, last_id=after, more=len(ids) > size)
    ids = ids[:size]
    if not ids:
        return report
    actor = f"{user.get_username()} ({via})"
    deadline = time.monotonic() + CHUNK_SECONDS
    with transaction.atomic():
        for job_id in ids:
            result = _one(action, job_id, actor)
            if result.changed:
                report.changed.append(result)
            else:
                report.skipped[result.reason] += 1
            report.last_id = job_id
            if time.monotonic() > deadline and job_id != ids[-1]:
                report.more = True  # the rest of this chunk goes to the next one
                break
        _audit(report, user, via)
    return report


def _one(action: str, job_id: int, actor: str) -> OperatorResult:
    """One job in a savepoint of its own, rolled back unless it changed: a skipped job's row lock
    (taken to decide) is released at once instead of held until the chunk commits."""
    if not 0 < job_id <= LAST_ID:  # no row holds it; SQLite cannot even be asked (OverflowError)
        return OperatorResult(job_id, action, False, "no such job")
    savepoint = transaction.savepoint_create()
    try:
        result = ACTIONS[action](job_id, actor)
    except DatabaseError as exc:  # this job's problem; the next one still runs
        transaction.savepoint_rollback(savepoint)
        logger.exception("operator %s of job %s failed", action, job_id)
        return OperatorResult(job_id, action, False, f"database error: {type(exc).__name__}")
    except BaseException:
        transaction.savepoint_rollback(savepoint)
        raise
    if result.changed:
        transaction.savepoint_commit(savepoint)
    else:
        transaction.savepoint_rollback(savepoint)
    return result


def apply(
    action: str,
    jobs: QuerySet[Job] | Iterable[int],
    *,
    user: AbstractBaseUser,
    via: str,
    limit: int | None = MAX_ROWS,
    after: int = 0,
    chunk: int | None = None,
    progress: Callable[[Report], None] | None = None,
) -> Report:
    """Apply `action` to each selected job (ids, or a queryset: "all matching the filter") with an
    id above `after`, oldest first, chunk by chunk, at most `limit` jobs (None: all of them).
    What is left is counted in `not_processed`; run again with `after=report.last_id`."""
    _check(action, user)
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    selection: QuerySet[Job] | list[int] = (
        jobs if isinstance(jobs, QuerySet) else sorted({int(i) for i in jobs})
    )
    report = Report(action, last_id=after, more=True)
    chunk = chunk or CHUNK_ROWS
    while report.more and (limit is None or report.processed < limit):
        size = chunk if limit is None else min(chunk, limit - report.processed)
        part = apply_chunk(
            action, selection, user=user, via=via, after=report.last_id, size=max(1, size)
        )
        report.add(part)
        if progress is not None:
            progress(report)
    if report.more:
        report.not_processed = (
            selection.filter(pk__gt=report.last_id).count()
            if isinstance(selection, QuerySet)
            else len([i for i in selection if i > report.last_id])
        )
    return report


def apply_confirmed(
    action: str, job_id: int, *, user: AbstractBaseUser, via: str, attempt: int | None
) -> Report | int:
    """Apply `action` to one job as a confirmation named it: at `attempt` (None: as it is now).
    Decided under the job's row lock, held until the change commits: if the job has moved on to
    another attempt (a claim, a reclaim), nothing is done and its attempt now is returned -- a
    press confirmed for "attempt 3 is running on vm:1234" never takes attempt 4 away. A copy
    changes no job: it is made whatever the attempt."""
    _check(action, user)
    if attempt is None or action == "copy" or not 0 < job_id <= LAST_ID:
        return apply(action, [job_id], user=user, via=via)
    with transaction.atomic():
        now = (
            Job.objects.select_for_update()
            .filter(pk=job_id)
            .values_list("attempt", flat=True)
            .first()
        )
        if now is not None and now != attempt:
            return int(now)
        return apply(action, [job_id], user=user, via=via)


def _audit(report: Report, user: AbstractBaseUser, via: str) -> None:
    if not report.changed:
        return
    job_type = ContentType.objects.get_for_model(Job)
    entries = []
    for r in report.changed:
        if report.action == "copy":
            message = f"enqueue a copy ({via}): copied as job {r.new_job_id}"
        else:
            message = f"{report.action} ({via}), fenced by attempt {r.attempt}: {r.reason}"
        entries.append(
            LogEntry(
                user_id=user.pk,
                content_type=job_type,
                object_id=str(r.job_id),
                object_repr=f"job {r.job_id}"[:200],
                action_flag=CHANGE,
                change_message=message,
            )
        )
        if report.action == "copy":
            entries.append(
                LogEntry(
                    user_id=user.pk,
                    content_type=job_type,
                    object_id=str(r.new_job_id),
                    object_repr=f"job {r.new_job_id}",
                    action_flag=ADDITION,
                    change_message=f"copy of job {r.job_id} ({via})",
                )
            )
    LogEntry.objects.bulk_create(entries)


def fence_note(job_id: int, action: str) -> str:
    """What pressing `action` will do to the job as it is now, in the fence's words, for a
    confirmation. The transition decides again under the row lock when it runs."""
    row = Job.objects.filter(pk=job_id).values("state", "attempt", "run_at").first()
    if row is None:
        return "no such job"
    state, attempt = row["state"], row["attempt"]
    if action == "copy":
        return "a new queued job with the same kind, payload, queue and limits; this one stays"
    if state == JobState.RUNNING:
        worker = (
            Attempt.objects.filter(job_id=job_id, number=attempt)
            .values_list("worker", flat=True)
            .first()
        ) or "an unknown worker"
        taken = {"requeue": "queued again at once", "cancel": "cancelled"}.get(action)
        if taken is None:
            return f"attempt {attempt} is running on {worker}: nothing changes"
        return (
            f"attempt {attempt} is running on {worker}; its later writes will be refused "
            f"(the job is {taken})"
        )
    plans = {
        ("requeue", JobState.FAILED): "queued again now with a fresh budget of attempts",
        ("requeue", JobState.CANCELLED): "queued again now with a fresh budget of attempts",
        ("cancel", JobState.QUEUED): "cancelled before it runs",
        ("retry", JobState.FAILED): "queued again now with a fresh budget of attempts",
        ("retry", JobState.QUEUED): "run now if it waits for a retry, else nothing changes",
    }
    plan = plans.get((action, state))
    if plan is None:
        return f"the job is {state} (attempt {attempt}): nothing changes"
    return f"the job is {state} (attempt {attempt}): {plan}"
