"""The queues page's numbers: per queue, what waits, what runs and what finished in the last hour.

Owns: read-only queries for /queues/ and the per-minute charts of the last hour. Never writes
(the pause/resume and limit controls write through jobs.ops.queues, called by dashboard/operate.py).

Every query is bounded at a million jobs: queued jobs are counted on their partial index
(jobs_job_queue_depth_idx: queue, run_at WHERE queued), running ones on jobs_job_lease_idx, and
the last hour reads only jobs that finished in it, on jobs_job_finished_idx (finished_at, queue,
state WHERE finished), so the cost follows the last hour's throughput, never the table's size --
and each process keeps the per-minute counts of settled minutes (see SETTLED_SECONDS), so a
page after the first reads the last two minutes only.
"""

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q
from django.db.models.functions import Now, TruncMinute

from dashboard.charts import Chart, Series, minutes_until
from jobs.core.sql.operator import database_clock
from jobs.core.states import JobState
from jobs.models import Job

HOUR_MINUTES = 60
# Queues the page lists (each with its two charts: ~19 KB of the page). A queue is whatever name
# producers enqueue into (one per tenant, say): 1,000 of them made every 5-second poll of this
# page 19 MB and 5 s of rendering. The rest are counted, never drawn.
MAX_QUEUES = 100


@dataclass
class QueueRow:
    name: str
    queued: int = 0  # due + scheduled
    due: int = 0  # queued with run_at <= now: waiting for a worker
    scheduled: int = 0  # queued with run_at in the future (retries, run_at)
    running: int = 0
    oldest_due: datetime | None = None
    succeeded_hour: int = 0
    failed_hour: int = 0
    cancelled_hour: int = 0
    paused: bool = False
    limit: int | None = None  # concurrency limit; None: unlimited
    succeeded_per_min: list[int] = field(default_factory=list)
    failed_per_min: list[int] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)

    def oldest_due_age(self, now: datetime) -> float | None:
        return None if self.oldest_due is None else max((now - self.oldest_due).total_seconds(), 0)


@dataclass
class QueuesPage:
    now: datetime
    minutes: list[datetime]  # the last hour's minute buckets, oldest first
    queues: list[QueueRow]
    more: int = 0  # queues left off (MAX_QUEUES): the least busy; paused, then limited, kept first


def _waiting(rows: dict[str, QueueRow]) -> None:
    """Queued jobs per queue, split at the database clock: an index-only scan of the partial
    queue-depth index (queued rows only)."""
    counts = (
        Job.objects.queued()
        .values("queue")
        .annotate(
            due=Count("id", filter=Q(run_at__lte=Now())),
            scheduled=Count("id", filter=Q(run_at__gt=Now())),
            oldest_due=Min("run_at", filter=Q(run_at__lte=Now())),
        )
        .order_by()
    )
    for c in counts:
        row = rows.setdefault(c["queue"], QueueRow(c["queue"]))
        row.due, row.scheduled, row.oldest_due = c["due"], c["scheduled"], c["oldest_due"]
        row.queued = row.due + row.scheduled


def _running(rows: dict[str, QueueRow]) -> None:
    for queue, n in Job.objects.running().values_list("queue").annotate(n=Count("id")).order_by():
        rows.setdefault(queue, QueueRow(queue)).running = n


def finished_between(since: datetime, until: datetime | None = None) -> list[dict[str, Any]]:
    """Jobs that finished in [since, until), by queue, minute and terminal state."""
    qs = Job.objects.filter(finished_at__gte=since)
    if until is not None:
        qs = qs.filter(finished_at__lt=until)
    return list(
        qs.values("queue", "state", minute=TruncMinute("finished_at"))
        .annotate(n=Count("*"))  # not Count("id"): the index holds no id, the scan stays index-only
        .order_by()
    )


# Minutes that ended more than SETTLED_SECONDS ago no longer change (a job's finished_at is the
# database clock of its finishing statement, committed within moments), so each process reads
# them once and keeps them until they leave the hour: a page then reads only the last couple of
# minutes, and its cost follows two minutes of throughput, not an hour's.
SETTLED_SECONDS = 120
_settled: dict[datetime, list[dict[str, Any]]] = {}
_settled_lock = threading.Lock()


def finished_per_minute(minutes: list[datetime], now: datetime) -> list[dict[str, Any]]:
    """The rows of finished_between(minutes[0]), settled minutes from this process's memory."""
    cutoff = (now - timedelta(seconds=SETTLED_SECONDS)).replace(second=0, microsecond=0)
    with _settled_lock:
        for gone in [m for m in _settled if m < minutes[0]]:
            del _settled[gone]
        missing = [m for m in minutes if m < cutoff and m not in _settled]
        if missing:
            for m in minutes:
                if missing[0] <= m < cutoff:
                    _settled[m] = []
            for r in finished_between(missing[0], cutoff):
                _settled.setdefault(r["minute"], []).append(r)
        settled = [r for m in minutes if m < cutoff for r in _settled.get(m, [])]
    return settled + finished_between(max(cutoff, minutes[0]))


def _last_hour(rows: dict[str, QueueRow], minutes: list[datetime], now: datetime) -> None:
    index = {m: i for i, m in enumerate(minutes)}
    per: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * len(minutes))
    for r in finished_per_minute(minutes, now):
        i = index.get(r["minute"])
        if i is not None:
            per[(r["queue"], r["state"])][i] += r["n"]
    for (queue, state), values in per.items():
        row = rows.setdefault(queue, QueueRow(queue))
        if state == JobState.SUCCEEDED:
            row.succeeded_per_min, row.succeeded_hour = values, sum(values)
        elif state == JobState.FAILED:
            row.failed_per_min, row.failed_hour = values, sum(values)
        elif state == JobState.CANCELLED:
            row.cancelled_hour = sum(values)


def hour_minutes(now: datetime) -> list[datetime]:
    """The starts of the last HOUR_MINUTES minutes, the current (partial) minute last."""
    return minutes_until(now, HOUR_MINUTES)


def failure_rate(succeeded: list[int], failed: list[int]) -> list[float]:
    """Failed jobs as a percentage of finished (succeeded + failed) jobs, per minute (0 if none)."""
    return [100.0 * f / (s + f) if s + f else 0.0 for s, f in zip(succeeded, failed, strict=True)]


def charts_for(row: QueueRow, minutes: list[datetime], slug: str) -> list[Chart]:
    zeros = [0] * len(minutes)
    ok = row.succeeded_per_min or zeros
    bad = row.failed_per_min or zeros
    return [
        Chart(
            "Throughput",
            "jobs/min",
            minutes,
            [Series("succeeded", list(ok), "ok"), Series("failed", list(bad), "bad")],
            chart_id=f"throughput-{slug}",
        ),
        Chart(
            "Failure rate",
            "%",
            minutes,
            [Series("failed", failure_rate(ok, bad), "bad")],
            fixed_max=100.0,
            chart_id=f"failure-rate-{slug}",
        ),
    ]


def queues_page(controls: dict[str, Any] | None = None) -> QueuesPage:
    """Every queue with queued, running or last-hour jobs, or a control (pause, limit) set."""
    now = database_clock()
    minutes = hour_minutes(now)
    rows: dict[str, QueueRow] = {}
    for name, control in (controls or {}).items():
        row = rows.setdefault(name, QueueRow(name))
        row.paused, row.limit = bool(control.paused), control.limit
    _waiting(rows)
    _running(rows)
    _last_hour(rows, minutes, now)
    shown = _busiest(list(rows.values()), MAX_QUEUES)
    slugs: set[str] = set()
    for row in shown:
        slug = "".join(c if c.isascii() and c.isalnum() else "-" for c in row.name)
        while slug in slugs:  # "a.b" and "a-b": element ids stay unique
            slug += "-"
        slugs.add(slug)
        row.charts = charts_for(row, minutes, slug)
    return QueuesPage(now, minutes, shown, more=len(rows) - len(shown))


def _busiest(rows: list[QueueRow], limit: int) -> list[QueueRow]:
    """At most `limit` queues, by name: the paused first (an operator must be able to resume
    them: a paused queue runs nothing, so it is never the busiest), then the limited, then the
    busiest -- queued, running and finished in the last hour."""

    def rank(row: QueueRow) -> tuple[bool, bool, int, str]:
        busy = row.queued + row.running + row.succeeded_hour + row.failed_hour + row.cancelled_hour
        return (not row.paused, row.limit is None, -busy, row.name)

    return sorted(sorted(rows, key=rank)[:limit], key=lambda row: row.name)
