"""Operator actions on a selection of jobs: requeue, cancel, retry now, enqueue a copy.

Owns: applying one action to many jobs one job at a time (each its own fenced transition in
jobs/core/transitions, so one job's refusal or error decides nothing for the others), the report of
what changed and what was skipped and why, and the audit trail in Django's LogEntry with the
attempt each fence carried. The admin and `manage.py jobs` both call apply().

Never: writes a job itself -- jobs/core/transitions does (`Job.objects.enqueue` for a copy).
Never processes more than `limit` jobs per call (a request must not run for an hour); what is
left is reported.
"""

import logging
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
from jobs.core.transitions import OperatorResult
from jobs.models import Job

logger = logging.getLogger("jobs.actions")

MAX_ROWS = 10_000
PERMISSION = "jobs.change_job"


def enqueue_copy(job_id: int, actor: str) -> OperatorResult:
    """A new queued job with the same kind, payload, queue, priority and limits (no unique_key)."""
    row = (
        Job.objects.filter(pk=job_id)
        .values("kind", "payload", "queue", "priority", "max_attempts", "lease_seconds", "state")
        .first()
    )
    if row is None:
        return OperatorResult(job_id, "copy", False, "no such job")
    try:
        with transaction.atomic():
            copy = Job.objects.enqueue(
                row["kind"],
                row["payload"],
                queue=row["queue"],
                priority=row["priority"],
                max_attempts=row["max_attempts"],
                lease_seconds=row["lease_seconds"],
            )
    except EnqueueError as exc:  # the kind is gone, the payload is now too large, ...
        return OperatorResult(
            job_id, "copy", False, f"refused by enqueue: {exc}"[:300], row["state"]
        )
    return OperatorResult(
        job_id, "copy", True, f"copied as job {copy.pk}", row["state"], new_job_id=copy.pk
    )


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
    not_processed: int = 0  # matched beyond the limit

    def summary(self) -> str:
        text = f"{self.action}: {len(self.changed)} changed, {sum(self.skipped.values())} skipped"
        if self.skipped:
            reasons = "; ".join(f"{n} {why}" for why, n in self.skipped.most_common())
            text += f" ({reasons})"
        if self.not_processed:
            text += f"; {self.not_processed} not processed (limit per action reached; run again)"
        return text


def may_act(user: Any) -> bool:
    """Staff with the job "change" permission (superusers have it)."""
    return bool(
        getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
        and user.has_perm(PERMISSION)
    )


def apply(
    action: str,
    jobs: QuerySet[Job] | Iterable[int],
    *,
    user: AbstractBaseUser,
    via: str,
    limit: int = MAX_ROWS,
) -> Report:
    """Apply `action` to each job (ids, or a queryset: "all matching the filter"), oldest first."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; one of {sorted(ACTIONS)}")
    if not may_act(user):
        raise PermissionError(f"{user} may not change jobs (needs staff and {PERMISSION})")
    if isinstance(jobs, QuerySet):
        ids = list(jobs.order_by("id").values_list("id", flat=True)[: limit + 1])
    else:
        ids = sorted(set(jobs))[: limit + 1]
    report = Report(action)
    if len(ids) > limit:
        total = jobs.count() if isinstance(jobs, QuerySet) else len(set(jobs))
        report.not_processed = total - limit
        ids = ids[:limit]
    actor = f"{user.get_username()} ({via})"
    step = ACTIONS[action]
    for job_id in ids:
        try:
            result = step(job_id, actor)
        except DatabaseError as exc:  # this job's problem; the next one still runs
            logger.exception("operator %s of job %s failed", action, job_id)
            result = OperatorResult(job_id, action, False, f"database error: {type(exc).__name__}")
        if result.changed:
            report.changed.append(result)
        else:
            report.skipped[result.reason] += 1
    _audit(report, user, via)
    return report


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
