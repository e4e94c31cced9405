"""Prometheus metrics at /metrics, derived from the database at scrape time.

Owns: the catalogue (every metric name is declared once, in CATALOGUE), the collector, and the
view. Never: counts in memory what a worker did -- workers, schedulers and web servers are
separate processes (often separate hosts), so every number here is read from the job tables,
which every process writes. Any web process answers the same numbers, and a restart loses
nothing. (prometheus_client's multiprocess mode would need one shared directory on one host and
loses counts when a worker is SIGKILLed mid-write; the tables already hold every event.)

Counters come from rows that are only ever added (events, rejected writes). A scrape must stay
cheap with millions of rows, so each process reads every row once: it keeps a running tally up
to the newest id it has read and, on each scrape, reads only the rows after it (a primary-key
range), so a scrape costs what was written since the last one, not the size of the table. An id
skipped over because its transaction had not committed yet is looked for again on later scrapes
(PENDING_SECONDS). The first scrape of a process reads the whole history once (its cost at a
million jobs is in the README); rows older than SETTLE_SECONDS are then taken as settled.

Gauges (queue depth, oldest due job, running and expired leases) are read live through partial
indexes. Extending: `register(source)` adds a callable returning metric families (see
`gauge_family`) to every scrape.

Hazards: deleting old rows (pruning jobs) makes a counter go down; Prometheus reads a decrease
as a counter reset, which rate() tolerates.
"""

import hmac
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from jobs.core.conf import jobs_settings
from jobs.core.sql import driver_for
from jobs.core.sql import metrics as sql
from jobs.core.sql.operator import database_clock
from jobs.core.states import EventType, Write
from jobs.effects import outbox
from jobs.ops.lease_hint import lease_hints

logger = logging.getLogger("jobs.metrics")

SETTLE_SECONDS = 10.0  # the first scrape of a process takes rows older than this as settled
PENDING_SECONDS = 60.0  # how long an id skipped over (its transaction still open) is looked for
MAX_PENDING = 10_000
MAX_QUEUE_LABELS = 100  # more queues than this are summed under queue="_other"

ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 10)
GAP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300)
RECLAIM_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
START_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

# name -> help. The DESIGN.md names first, then the operational ones.
CATALOGUE = {
    "jobs_stale_writes_rejected_total": "Fenced writes that changed zero rows, by write.",
    "jobs_claims_total": "Claims (each made a new attempt).",
    "jobs_reclaims_total": "Expired leases reclaimed by the reaper.",
    "jobs_succeeded_total": "Jobs committed as succeeded.",
    "jobs_failed_total": "Jobs that ended failed (last attempt failed or expired, or poisoned).",
    "jobs_effects_deduplicated_total": "Effects not performed again: the sum of repeats.",
    "jobs_orphaned_outputs": "Staged outputs found orphaned (JobEvent rows of type orphaned).",
    "jobs_running_expired_leases": "Running jobs whose lease has run out, not yet reclaimed.",
    "jobs_queue_depth": "Queued jobs, by queue (due now or later).",
    "jobs_queue_oldest_age_seconds": "How long the oldest due job of a queue has waited.",
    "jobs_running": "Jobs running now.",
    "jobs_outbox_pending_intents": "Intents waiting for the relay (pending or being performed).",
    "jobs_outbox_oldest_pending_age_seconds": "Age of the oldest intent not yet performed.",
    "jobs_outbox_relay_reperforms_total": "Intents the relay took up again after an earlier claim.",
    "jobs_outbox_reconciliation_mismatches_total": "Intents decided by a target's reconciliation.",
    "jobs_outbox_failed_intents": "Intents that ended failed after their retries.",
    "jobs_events_total": "Job events, by type.",
    "jobs_attempts_per_success": "Attempts a job took to succeed.",
    "jobs_wasted_work_seconds_total": "Runtime of attempts whose commit was rejected.",
    "jobs_heartbeat_gap_seconds": "Longest time between accepted beats, per ended attempt.",
    "jobs_reclaim_latency_seconds": "Lease expiry to the next claim of that job.",
    "jobs_enqueue_to_start_seconds": "Job due (enqueued or run_at) to its first claim.",
    "jobs_lease_too_short": "1 for a kind whose recent heartbeat gaps approach its lease.",
    "jobs_metrics_scrape_seconds": "Time this scrape took to collect (almost all of it queries).",
}


@dataclass
class Hist:
    buckets: list[int]
    count: int = 0
    total: float = 0.0

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> "Hist":
        return cls([0] * len(bounds))

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "Hist":
        *buckets, count, total = row
        return cls([int(b or 0) for b in buckets], int(count or 0), float(total or 0.0))

    def __add__(self, other: "Hist") -> "Hist":
        merged = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        return Hist(merged, self.count + other.count, self.total + other.total)

    def family(self, name: str, bounds: Sequence[float]) -> HistogramMetricFamily:
        points = [(repr(float(b)), float(n)) for b, n in zip(bounds, self.buckets, strict=True)]
        return HistogramMetricFamily(
            name,
            CATALOGUE[name],
            buckets=[*points, ("+Inf", float(self.count))],
            sum_value=self.total,
        )


@dataclass
class Tally:
    """What a range of event and rejected-write rows adds to the counters."""

    events: Counter[str] = field(default_factory=Counter)
    success_attempts: Counter[int] = field(default_factory=Counter)
    gaps: Hist = field(default_factory=lambda: Hist.empty(GAP_BUCKETS))
    starts: Hist = field(default_factory=lambda: Hist.empty(START_BUCKETS))
    reclaims: Hist = field(default_factory=lambda: Hist.empty(RECLAIM_BUCKETS))
    rejected: Counter[str] = field(default_factory=Counter)
    wasted: float = 0.0
    rows: int = 0  # rows read

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(
            self.events + other.events,
            self.success_attempts + other.success_attempts,
            self.gaps + other.gaps,
            self.starts + other.starts,
            self.reclaims + other.reclaims,
            self.rejected + other.rejected,
            self.wasted + other.wasted,
            self.rows + other.rows,
        )


def _events(rows: sql.Rows) -> Tally:
    t = Tally()
    driver = driver_for(connection.vendor)
    with connection.cursor() as cur:
        t.events.update(dict(sql.event_counts(cur, rows)))
        t.rows = sum(t.events.values())
        if not t.rows:
            return t
        t.success_attempts.update(dict(sql.success_attempts(cur, rows)))
        t.gaps = Hist.from_row(sql.heartbeat_gaps(cur, rows, GAP_BUCKETS))
        t.starts = Hist.from_row(sql.start_latency(driver, cur, rows, START_BUCKETS))
        t.reclaims = Hist.from_row(
            sql.reclaim_latency(driver, connection.vendor, cur, rows, RECLAIM_BUCKETS)
        )
    return t


def _rejections(rows: sql.Rows) -> Tally:
    t = Tally()
    with connection.cursor() as cur:
        t.rejected.update(dict(sql.rejected_counts(cur, rows)))
        t.rows = sum(t.rejected.values())
        if t.rows:
            t.wasted = sql.wasted_seconds(driver_for(connection.vendor), cur, rows)
    return t


@contextmanager
def _one_snapshot() -> Iterator[None]:
    """A REPEATABLE READ transaction on PostgreSQL: every read inside sees the same rows.

    (Inside a caller's transaction -- tests -- the reads join it. SQLite's IMMEDIATE
    transactions would take the write lock, so there the reads run as they are.)
    """
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


class _Incremental:
    """Counters over an append-only table, each row read once per process.

    Rows up to `counted_to` are in `tally`. An id at or below it that was not visible when its
    range was read (its transaction still open) is *pending*: looked for again on every scrape
    for PENDING_SECONDS, then given up (a rolled-back insert leaves such a hole for good).
    """

    def __init__(self, table: str, read: Callable[[sql.Rows], Tally]) -> None:
        self.table = table
        self.read = read
        self._reset(None)

    def _reset(self, database: str | None) -> None:
        self.database = database
        self.counted_to = 0
        self.tally = Tally()
        self.pending: dict[int, float] = {}

    def total(self, cutoff: datetime) -> Tally:
        name = str(connection.settings_dict.get("NAME"))
        if name != self.database:
            self._reset(name)  # another database (tests): start over
            with connection.cursor() as cur:
                # The first scrape takes rows written before `cutoff` as settled.
                settled = sql.newest_id_before(cur, self.table, cutoff)
            self.tally = self.read(sql.Rows(0, settled))
            self.counted_to = settled
        with connection.cursor() as cur:
            oldest, newest = sql.id_span(cur, self.table)
        if newest < self.counted_to or (self.tally.rows and oldest > self.counted_to):
            # Every row counted is gone (the table was emptied or pruned past what we read):
            # start over -- Prometheus reads the drop as a counter reset.
            self._reset(None)
            return self.total(cutoff)
        if newest > self.counted_to:
            self._count_new(newest)
        if self.pending:
            self._recheck_pending()
        return self.tally

    # Both steps read everything first and change the state last, so a database error half-way
    # leaves the tally as it was (the rows are read again next time, never counted twice). Their
    # two reads share one snapshot, or a row committed between them would be seen by one only.

    def _count_new(self, newest: int) -> None:
        with _one_snapshot():
            self._count_new_in_snapshot(newest)

    def _count_new_in_snapshot(self, newest: int) -> None:
        rows = sql.Rows(self.counted_to, newest)
        fresh = self.read(rows)
        missing = newest - self.counted_to - fresh.rows
        skipped: list[int] = []
        if 0 < missing <= MAX_PENDING:
            with connection.cursor() as cur:
                present = set(sql.ids(cur, self.table, rows))
            skipped = [i for i in range(self.counted_to + 1, newest + 1) if i not in present]
        elif missing > MAX_PENDING:
            logger.warning("%s: %s ids skipped at once; not looked for again", self.table, missing)
        now = time.monotonic()
        self.tally = self.tally + fresh
        self.pending.update(dict.fromkeys(skipped, now))
        self.counted_to = newest

    def _recheck_pending(self) -> None:
        with _one_snapshot():
            self._recheck_pending_in_snapshot()

    def _recheck_pending_in_snapshot(self) -> None:
        ids = sorted(self.pending)
        found = self.read(sql.Rows(ids=ids))
        if found.rows:
            with connection.cursor() as cur:
                visible = sql.ids(cur, self.table, sql.Rows(ids=ids))
            self.tally = self.tally + found
            for i in visible:
                self.pending.pop(i, None)
        expired_before = time.monotonic() - PENDING_SECONDS
        for i, seen in list(self.pending.items()):
            if seen < expired_before:
                del self.pending[i]


_lock = threading.Lock()
_event_tally = _Incremental("jobs_jobevent", _events)
_rejection_tally = _Incremental("jobs_rejectedwrite", _rejections)


def _outbox() -> Iterable[Metric]:
    """The outbox relay's figures (jobs.outbox.counts, read from jobs_intent)."""
    c = outbox.counts()
    yield _gauge("jobs_outbox_pending_intents", c["pending_intents"])
    yield _gauge("jobs_outbox_oldest_pending_age_seconds", c["oldest_pending_age_seconds"])
    yield _counter("jobs_outbox_relay_reperforms_total", c["relay_reperforms"])
    yield _counter("jobs_outbox_reconciliation_mismatches_total", c["reconciliation_mismatches"])
    yield _gauge("jobs_outbox_failed_intents", c["failed_intents"])


_sources: list[Callable[[], Iterable[Metric]]] = [_outbox]


def register(source: Callable[[], Iterable[Metric]]) -> None:
    """Add metric families to every scrape (e.g. outbox counts); declare names in CATALOGUE."""
    if source not in _sources:
        _sources.append(source)


def gauge_family(name: str, doc: str, values: Mapping[str, float], label: str) -> Metric:
    """One gauge with a label per key: `gauge_family("jobs_outbox", "...", counts(), "status")`."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([str(key)], float(value))
    return family


def _counter(name: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name.removesuffix("_total"), CATALOGUE[name], value=value)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, CATALOGUE[name], value=value)


def _success_histogram(counts: Counter[int]) -> HistogramMetricFamily:
    cumulative = [sum(n for a, n in counts.items() if a <= b) for b in ATTEMPT_BUCKETS]
    total = sum(counts.values())
    hist = Hist(cumulative, total, float(sum(a * n for a, n in counts.items())))
    return hist.family("jobs_attempts_per_success", ATTEMPT_BUCKETS)


def _queue_families(rows: list[tuple[str, int, float | None]]) -> list[Metric]:
    # Configured queues (and "default") are always present, at 0 when empty: an alert on a
    # missing series is easy to get wrong.

    seen = {r[0] for r in rows}
    known = set(jobs_settings().QUEUES or ()) | {"default"}
    rows = sorted([*rows, *((q, 0, None) for q in known - seen)], key=lambda r: (-r[1], r[0]))
    kept, rest = rows[:MAX_QUEUE_LABELS], rows[MAX_QUEUE_LABELS:]
    if rest:
        ages = [r[2] for r in rest if r[2] is not None]
        kept.append(("_other", sum(r[1] for r in rest), max(ages) if ages else None))
    depth = GaugeMetricFamily("jobs_queue_depth", CATALOGUE["jobs_queue_depth"], labels=["queue"])
    age_name = "jobs_queue_oldest_age_seconds"
    age = GaugeMetricFamily(age_name, CATALOGUE[age_name], labels=["queue"])
    for queue, n, oldest in kept:
        depth.add_metric([queue], n)
        age.add_metric([queue], max(0.0, oldest or 0.0))
    return [depth, age]


def collect_families() -> list[Metric]:
    """Every metric family of one scrape (all from the database)."""
    started = time.perf_counter()
    driver = driver_for(connection.vendor)
    cutoff = database_clock() - timedelta(seconds=SETTLE_SECONDS)
    with _lock:
        tally = _event_tally.total(cutoff) + _rejection_tally.total(cutoff)
    with connection.cursor() as cur:
        queue_rows = sql.queues(driver, cur)
        running, expired = sql.running(driver, cur)
        deduplicated = sql.effects_deduplicated(cur)
    ev = tally.events
    rejected = CounterMetricFamily(
        "jobs_stale_writes_rejected",
        CATALOGUE["jobs_stale_writes_rejected_total"],
        labels=["write"],
    )

    for write in Write.values:
        rejected.add_metric([write], tally.rejected.get(write, 0))
    events = CounterMetricFamily("jobs_events", CATALOGUE["jobs_events_total"], labels=["type"])
    for kind in sorted(set(EventType.values) | set(ev)):
        events.add_metric([kind], ev.get(kind, 0))
    families: list[Metric] = [
        rejected,
        _counter("jobs_claims_total", ev["claimed"]),
        _counter("jobs_reclaims_total", ev["expired"]),
        _counter("jobs_succeeded_total", ev["succeeded"]),
        _counter("jobs_failed_total", ev["failed"] + ev["poisoned"]),
        _counter("jobs_effects_deduplicated_total", deduplicated),
        _gauge("jobs_orphaned_outputs", ev["orphaned"]),
        _gauge("jobs_running_expired_leases", expired),
        _gauge("jobs_running", running),
        *_queue_families(queue_rows),
        events,
        _success_histogram(tally.success_attempts),
        _counter("jobs_wasted_work_seconds_total", tally.wasted),
        tally.gaps.family("jobs_heartbeat_gap_seconds", GAP_BUCKETS),
        tally.reclaims.family("jobs_reclaim_latency_seconds", RECLAIM_BUCKETS),
        tally.starts.family("jobs_enqueue_to_start_seconds", START_BUCKETS),
    ]

    too_short = GaugeMetricFamily(
        "jobs_lease_too_short", CATALOGUE["jobs_lease_too_short"], labels=["kind"]
    )
    for hint in lease_hints():
        too_short.add_metric([hint.kind], 1.0 if hint.too_short else 0.0)
    families.append(too_short)
    for source in _sources:
        families.extend(source())
    families.append(_gauge("jobs_metrics_scrape_seconds", time.perf_counter() - started))
    return families


class _DatabaseCollector(Collector):
    def collect(self) -> Iterable[Metric]:
        return collect_families()


def render() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DatabaseCollector())
    return generate_latest(registry)


def _token() -> str:
    return str(
        getattr(settings, "JOBS_METRICS_TOKEN", "") or os.environ.get("JOBS_METRICS_TOKEN", "")
    )


def allowed(request: HttpRequest) -> bool:
    """A bearer token (JOBS_METRICS_TOKEN), or a logged-in staff user."""
    token = _token()
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and getattr(user, "is_staff", False))


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        response = HttpResponse("metrics need a bearer token or a staff login\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(render(), content_type="text/plain; version=0.0.4; charset=utf-8")
