"""An operator's hands on cron schedules: disable, enable and run now, each audited in LogEntry.

Owns: the three operator writes to jobs_schedule and their audit rows. Each runs in one
transaction that first locks the schedule row (`FOR UPDATE`), so it never interleaves with a
scheduler's tick (jobs/ops/cron.py locks the same row to move `next_at`).

- disable: `enabled = false`; the scheduler enqueues nothing for it. It stands across restarts:
  cron.sync re-enables only rows it disabled itself (source `undeclared`), never an operator's.
- enable: `enabled = true` and `next_at` = the first tick after now; ticks missed while it was
  disabled are not caught up (an operator who wants one presses "run now").
- run now: enqueues the schedule's job at once (kind, payload, queue, unique key
  `schedule:<name>:<now>`) and records it as the schedule's last job, so the next tick waits or
  is skipped while it runs (no pile-up, as for a tick). Refused while the previous run is live.
Enable and run now are refused for a schedule nothing declares any more (cron.sync marks it,
cron.NOT_DECLARED): what runs is what the code declares.

Never: decides who may press (callers check may_control) -- but every function refuses a user who
may not, so a caller's slip cannot write unaudited or unauthorised.
"""

from datetime import UTC
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction

from jobs.core.crontab import next_tick
from jobs.core.exceptions import EnqueueError
from jobs.core.sql.operator import database_clock
from jobs.core.states import LIVE_STATES
from jobs.models import Job, Schedule
from jobs.ops.cron import NOT_DECLARED

PERMISSION = "jobs.change_schedule"


class ScheduleControlError(ValueError):
    """An operator's request on a schedule that cannot be honoured; the message says why."""


def may_control(user: Any) -> bool:
    """Active staff with the schedule "change" permission (superusers have it)."""
    return bool(
        getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
        and user.has_perm(PERMISSION)
    )


def _locked(name: str, user: Any) -> Schedule:
    if not may_control(user):
        raise PermissionError(f"{user} may not change schedules (needs staff and {PERMISSION})")
    # A name no schedule can have (PostgreSQL refuses a NUL in text) is simply not one.
    bad = not isinstance(name, str) or "\x00" in name or len(name) > 1000
    row = None if bad else Schedule.objects.select_for_update().filter(name=name).first()
    if row is None:
        raise ScheduleControlError(f"no schedule named {name!r:.200}")
    return row


def _refuse_undeclared(row: Schedule) -> None:
    if row.source in NOT_DECLARED:
        raise ScheduleControlError(
            f"schedule {row.name!r} is no longer declared (settings or @handler); declare it "
            "again to run it"
        )


def _audit(user: Any, row: Schedule, message: str) -> None:
    LogEntry.objects.create(
        user_id=user.pk,
        content_type=ContentType.objects.get_for_model(Schedule),
        object_id=str(row.pk),
        object_repr=str(row)[:200],
        action_flag=CHANGE,
        change_message=message[:1000],
    )


def set_enabled(name: str, enabled: bool, *, user: Any, via: str = "dashboard") -> bool:
    """Enable or disable the schedule; False (and no audit row) if it already was."""
    with transaction.atomic():
        row = _locked(name, user)
        if row.enabled == enabled:
            return False
        fields: dict[str, Any] = {"enabled": enabled}
        if enabled:
            _refuse_undeclared(row)
            fields["next_at"] = next_tick(row.cron, row.timezone, database_clock())
        Schedule.objects.filter(pk=row.pk).update(**fields)
        word = "enabled" if enabled else "disabled"
        detail = f", next tick {fields['next_at'].isoformat()}" if enabled else ""
        _audit(user, row, f"{word} ({via}){detail}")
    return True


def run_now(name: str, *, user: Any, via: str = "dashboard") -> Job:
    """Enqueue the schedule's job now; refused while its previous run is queued or running,
    and for a schedule no longer declared."""
    with transaction.atomic():
        row = _locked(name, user)
        _refuse_undeclared(row)
        if row.last_job_id is not None:
            live = Job.objects.filter(pk=row.last_job_id, state__in=list(LIVE_STATES)).exists()
            if live:
                raise ScheduleControlError(
                    f"the previous run of {name!r} (job {row.last_job_id}) is still queued or "
                    "running"
                )
        now = database_clock().astimezone(UTC)
        try:
            with transaction.atomic():
                job: Job = Job.objects.enqueue(
                    row.kind,
                    row.payload,
                    queue=row.queue,
                    unique_key=f"schedule:{row.name}:{now.strftime('%Y-%m-%dT%H:%M:%SZ')}"[:200],
                )
        except EnqueueError as exc:  # the kind is gone, the payload is now refused, ...
            raise ScheduleControlError(f"refused by enqueue: {exc}"[:300]) from exc
        Schedule.objects.filter(pk=row.pk).update(last_job=job)
        _audit(user, row, f"run now ({via}): enqueued job {job.pk}")
    return job
