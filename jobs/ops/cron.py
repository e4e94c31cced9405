"""Cron schedules: recurring jobs declared in settings or on @handler, enqueued by the scheduler.

Owns: validating declarations, keeping jobs_schedule in step with them (sync), and enqueueing
each due tick (run_due). Never: claims or runs a job -- a tick is an ordinary jobs.enqueue.

Declaring::

    JOBS_SCHEDULES = {"nightly-report": {"kind": "report.render", "cron": "0 3 * * *",
                      "timezone": "Europe/Paris", "payload": {...}, "missed": "latest"}}
    @handler("mail.digest", cron="*/15 * * * *", timezone="UTC")   # the schedule is named
                                                                   # after the kind

Exactly once, with any number of schedulers: a tick is enqueued in the same transaction that
moves the schedule's `next_at` past it, and that transaction first locks the row with
`SELECT ... FOR UPDATE SKIP LOCKED` and re-checks `next_at` (the fence): a second scheduler
either skips the locked row or finds `next_at` already moved. Each tick's job also carries the
unique key `schedule:<name>:<tick>`.

Missed ticks (the cluster was down, or the previous run is still going) follow `missed`:
  latest  enqueue the most recent due tick once; older missed ticks are skipped (default)
  all     enqueue every missed tick, one at a time: the next one only after the previous run
          ended, at most MAX_CATCH_UP behind (older ones are skipped in the same pass, which
          enqueues the oldest kept one)
  skip    enqueue a tick only if it is at most GRACE_SECONDS late; otherwise wait for the next
A tick never starts while the previous tick's job is still queued or running (no pile-up): under
`latest`/`skip` that tick is skipped and counted; under `all` it waits.

A failure stays with its own schedule: each is synced and ticked in its own transaction under
its own deadline, its ticks counted (croniter, no lock held) before it; a pass of run_due starts
no schedule after PASS_SECONDS, and those left, due still, come first at the next pass.

Hazards: a bad declaration (unknown kind, bad cron or one that never fires, unknown time zone, a
payload enqueue would refuse) is reported by the system check jobs.E010 and skipped at run time;
it stops no other schedule. Times are stored in UTC; cron is evaluated in the schedule's time
zone by jobs.core.crontab, daylight saving as Vixie cron does it (a 02:30 tick on a
spring-forward day runs at 03:00 local time; "30 2 * * *" runs once on a fall-back night).
"""

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)

from jobs.core import bounds, crontab
from jobs.core.conf import jobs_settings
from jobs.core.connectivity import bounded
from jobs.core.crontab import next_tick, ticks_after, ticks_before
from jobs.core.enqueue import QUEUE_NAME
from jobs.core.exceptions import EnqueueError, UnknownKind
from jobs.core.registry import _handlers, get_handler
from jobs.core.sql.operator import database_clock
from jobs.core.states import LIVE_STATES
from jobs.models import Job, Schedule

logger = logging.getLogger("jobs.schedules")

MAX_CATCH_UP = 100  # `all`: missed ticks further behind than this are skipped
MAX_SKIPPED_COUNTED = 10_000  # a schedule far behind counts its skipped ticks up to this (~0.3 s)
GRACE_SECONDS = 60.0  # `skip`: how late a tick may still be enqueued
PASS_SECONDS = 2.0  # a pass of run_due starts no schedule after this long (the rest: next pass)
MISSED = {choice.value for choice in Schedule.Missed}
# The source sync gives a row it disabled because nothing declares it any more; declared again,
# it is enabled again. A disabled row with any other source was disabled by an operator
# (jobs/ops/cron_controls.py): sync leaves it so -- if nothing declares it any more either, its
# source becomes UNDECLARED_PAUSED, and declared again it stays disabled. An operator can neither
# enable nor run a schedule with either source.
UNDECLARED = "undeclared"
UNDECLARED_PAUSED = "undeclared-off"
NOT_DECLARED = (UNDECLARED, UNDECLARED_PAUSED)


@dataclass(frozen=True)
class Declared:
    name: str
    kind: str
    cron: str
    timezone: str = "UTC"
    payload: Any = field(default_factory=dict)
    queue: str = "default"
    missed: str = Schedule.Missed.LATEST
    source: str = "settings"


def declared(now: datetime | None = None) -> tuple[list[Declared], list[str]]:
    """Every declaration from settings and handlers, and the errors of those that are invalid
    (a cron expression must fire after `now`, default the wall clock: system checks run with
    no database)."""
    now = now or datetime.now(UTC)
    found: list[Declared] = []
    errors: list[str] = []
    raw = getattr(settings, "JOBS_SCHEDULES", {}) or {}
    if not isinstance(raw, dict):
        return [], ["JOBS_SCHEDULES must be a dict of name -> options"]
    items: list[tuple[str, Any, str]] = [(name, opts, "settings") for name, opts in raw.items()]
    for h in list(_handlers.values()):
        if getattr(h, "cron", None):
            opts = {"kind": h.kind, "cron": h.cron, "timezone": getattr(h, "timezone", "UTC")}
            items.append((h.kind, opts, "handler"))
    for name, opts, source in items:
        try:
            found.append(_validated(name, opts, source, now))
        except (ValueError, TypeError) as exc:
            errors.append(f"schedule {name!r}: {exc}")
    names = [d.name for d in found]
    for dup in {n for n in names if names.count(n) > 1}:
        errors.append(f"schedule {dup!r} is declared twice")
        found = [d for d in found if d.name != dup]
    return found, errors


def _validated(name: Any, opts: Any, source: str, now: datetime) -> Declared:
    if not isinstance(name, str):
        raise ValueError("a schedule name is a string of 1-100 characters")
    bounds.storable_text("a schedule name", name, 100)  # PostgreSQL refuses NUL: sync would fail
    if not isinstance(opts, dict):
        raise ValueError("options must be a dict")
    unknown = set(opts) - {"kind", "cron", "timezone", "payload", "queue", "missed"}
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}")
    d = Declared(name=name, source=source, **opts)
    get_handler(d.kind)  # UnknownKind is a ValueError
    crontab.check(d.cron, d.timezone, now)  # syntax, time zone, and that it ever fires
    if d.missed not in MISSED:
        raise ValueError(f"missed must be one of {sorted(MISSED)}")
    bounds.json_value(d.payload, jobs_settings().MAX_PAYLOAD_BYTES)
    if not isinstance(d.queue, str) or not QUEUE_NAME.match(d.queue):
        raise ValueError(f"queue {d.queue!r} is not a queue name")
    return d


def sync(now: datetime | None = None) -> None:
    """Create or update one row per declaration; disable rows no longer declared and mark them
    so (source UNDECLARED, or UNDECLARED_PAUSED for one an operator had disabled). A row an
    operator disabled stays disabled. Each declaration in its own transaction: one that fails
    is logged and skipped, and the others are synced."""
    with bounded("cron: sync"):
        now = now or database_clock()
    wanted, errors = declared(now)
    for error in errors:
        logger.error("%s; skipped", error)
    for d in wanted:
        try:
            with bounded(f"cron: sync {d.name}"):  # a deadline each, as run_due's
                _sync_one(d, now)
        except IntegrityError:
            pass  # another scheduler created it at the same moment: theirs stands
        except (OperationalError, InterfaceError):
            raise  # the connection's, not this declaration's: the scheduler's outage path
        except (DatabaseError, ValueError):  # this declaration's problem only
            logger.exception("schedule %r: not synced; the others are", d.name)
    gone = Schedule.objects.exclude(name__in=[d.name for d in wanted])
    with bounded("cron: sync undeclared"):
        gone.filter(enabled=True).update(enabled=False, source=UNDECLARED)
        gone.filter(enabled=False).exclude(source__in=NOT_DECLARED).update(source=UNDECLARED_PAUSED)


def _sync_one(d: Declared, now: datetime) -> None:
    fields = {
        "kind": d.kind,
        "cron": d.cron,
        "timezone": d.timezone,
        "payload": d.payload,
        "queue": d.queue,
        "missed": d.missed,
        "source": d.source,
        "enabled": True,
    }
    with transaction.atomic():
        row = Schedule.objects.select_for_update().filter(name=d.name).first()
        if row is None:
            first = next_tick(d.cron, d.timezone, now)
            Schedule.objects.create(name=d.name, next_at=first, **fields)
            return
        timing_changed = (row.cron, row.timezone) != (d.cron, d.timezone)
        paused = not row.enabled and row.source != UNDECLARED  # an operator's decision
        fields["enabled"] = not paused
        if timing_changed or (not row.enabled and not paused):
            fields["next_at"] = next_tick(d.cron, d.timezone, now)
        Schedule.objects.filter(pk=row.pk).update(**fields)


@dataclass
class TickReport:
    enqueued: int = 0
    skipped: int = 0
    deferred: int = 0  # due schedules left to the next pass: this one had used its time


@dataclass(frozen=True)
class Walk:
    """A schedule's due ticks at `now`, counted from its `next_at` before its row is locked."""

    due: list[datetime]  # oldest first: `next_at` and what follows up to now, the last 100 kept
    dropped: int  # due ticks older than those kept (counted up to MAX_SKIPPED_COUNTED)
    after: datetime  # the first tick after the last due one


def run_due(now: datetime | None = None, budget_seconds: float = PASS_SECONDS) -> TickReport:
    """Enqueue what is due on every enabled schedule, the longest due first.

    Each schedule on its own: its ticks counted first (croniter alone: most of a second for one
    days behind), then one transaction under its own deadline (jobs.core.connectivity), so one
    schedule's slowness never cuts another's transaction. No schedule but the first is started
    once the pass has run `budget_seconds`: those left are due at the next pass, and the
    scheduler's other work (drains, the reaper) is not held up behind a long catch-up.
    """
    started = time.monotonic()
    report = TickReport()
    with bounded("cron: due schedules"):
        now = now or database_clock()
        due = list(
            Schedule.objects.filter(enabled=True, next_at__lte=now)
            .order_by("next_at", "pk")
            .values_list("pk", "name", "cron", "timezone", "next_at")
        )
    for i, (pk, name, cron, tz, seen) in enumerate(due):
        if i and time.monotonic() - started >= budget_seconds:  # the first always runs
            report.deferred += 1
            continue
        try:
            walk = _walk(cron, tz, seen, now)
            with bounded(f"cron: schedule {name}"):
                _run_one(pk, (seen, cron, tz), walk, now, report)
        except (DatabaseError, EnqueueError, ValueError) as exc:  # this schedule's problem only
            logger.error("schedule %s: tick failed: %s", name, exc)
    if report.deferred:
        logger.info("%s due schedule(s) left to the next pass", report.deferred)
    return report


def _run_one(
    pk: int, fence: tuple[datetime, str, str], walk: Walk, now: datetime, report: TickReport
) -> None:
    next_at_seen, cron, tz = fence  # as read by the pass, and as `walk` was counted with
    with transaction.atomic():
        # The fence: still ours to move only if no other scheduler moved next_at meanwhile (nor
        # a sync changed the timing the walk was counted with).
        locked = Schedule.objects.filter(
            pk=pk, next_at=next_at_seen, cron=cron, timezone=tz, enabled=True
        )
        if connection.features.has_select_for_update_skip_locked:
            locked = locked.select_for_update(skip_locked=True)
        row = locked.first()
        if row is None:
            return
        busy = (
            row.last_job_id is not None
            and Job.objects.filter(pk=row.last_job_id, state__in=list(LIVE_STATES)).exists()
        )
        tick, skipped, next_at = _decide(row.missed, walk, now, busy)
        job = None
        if tick is not None:
            try:
                get_handler(row.kind)
            except UnknownKind:
                logger.error(
                    "schedule %s: kind %r is not registered; tick skipped", row.name, row.kind
                )
                tick, skipped = None, skipped + 1
            else:
                job = _enqueue_tick(row, tick)
        updated = Schedule.objects.filter(pk=pk, next_at=next_at_seen).update(
            next_at=next_at,
            last_tick_at=tick if tick is not None else row.last_tick_at,
            last_job=job if job is not None else row.last_job,
            ticks_enqueued=row.ticks_enqueued + (job is not None),
            ticks_skipped=row.ticks_skipped + skipped,
        )
        if updated != 1:  # cannot happen under the row lock; never enqueue without the move
            raise DatabaseError(f"schedule {row.name}: next_at moved under the lock")
    report.enqueued += job is not None
    report.skipped += skipped
    if skipped:
        logger.info("schedule %s: %s tick(s) skipped (policy %s)", row.name, skipped, row.missed)


def _walk(cron: str, tz: str, next_at: datetime, now: datetime) -> Walk:
    due: list[datetime] = [next_at]
    for t in ticks_after(cron, tz, next_at):
        if t > now or len(due) > MAX_CATCH_UP:
            break
        due.append(t)
    dropped = 0
    if len(due) > MAX_CATCH_UP:  # further behind than kept: the most recent ticks, from now back
        due = _ticks_back(cron, tz, now, MAX_CATCH_UP)
        dropped = _count_from(cron, tz, next_at, due[0])
    return Walk(due, dropped, next_tick(cron, tz, due[-1]))


def _decide(
    missed: str, walk: Walk, now: datetime, busy: bool
) -> tuple[datetime | None, int, datetime]:
    """(tick to enqueue or None, ticks skipped, the new next_at)."""
    due, dropped, after_latest = walk.due, walk.dropped, walk.after
    latest = due[-1]
    if missed == Schedule.Missed.ALL:
        if busy:  # wait: this tick runs once the previous one ended (the dropped stay dropped)
            return None, dropped, due[0]
        return due[0], dropped, due[1] if len(due) > 1 else after_latest
    if busy:
        return None, dropped + len(due), after_latest
    if missed == Schedule.Missed.SKIP and (now - latest) > timedelta(seconds=GRACE_SECONDS):
        return None, dropped + len(due), after_latest
    return latest, dropped + len(due) - 1, after_latest


def _ticks_back(cron: str, tz: str, now: datetime, n: int) -> list[datetime]:
    """The `n` most recent ticks due at `now` (`now` itself included, as the forward walk of
    `_walk` counts it), oldest first, in UTC."""
    back = list(islice(ticks_before(cron, tz, now), n))[::-1]
    following = next_tick(cron, tz, back[-1])  # ticks_before is strictly before `now`
    return back[1:] + [following] if following <= now else back


def _count_from(cron: str, tz: str, first: datetime, end: datetime) -> int:
    """Ticks from `first` (a tick) up to `end`, counted up to MAX_SKIPPED_COUNTED."""
    count = 1
    for t in ticks_after(cron, tz, first):
        if t >= end or count >= MAX_SKIPPED_COUNTED:
            break
        count += 1
    return count


def _enqueue_tick(row: Schedule, tick: datetime) -> Job:
    return Job.objects.enqueue(  # type: ignore[no-any-return]
        row.kind,
        row.payload,
        queue=row.queue,
        unique_key=f"schedule:{row.name}:{tick.strftime('%Y-%m-%dT%H:%M:%SZ')}"[:200],
    )
