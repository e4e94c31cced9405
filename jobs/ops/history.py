"""Counters over the append-only tables (events, rejected writes), each row read once.

Owns: the running tally a process keeps for /metrics (jobs/ops/metrics.py renders it): per table,
the newest id read and what the rows up to it add to the counters; a scrape reads only the rows
after it (a primary-key range), so it costs what was written since the last scrape, not the size
of the table. An id skipped over because its transaction had not committed yet is looked for
again on later scrapes for PENDING_SECONDS. Never: counts in memory what a worker did -- every
number is read from rows every process writes.
"""

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from jobs.core.sql import driver_for
from jobs.core.sql import metrics as sql

logger = logging.getLogger("jobs.metrics")

PENDING_SECONDS = 60.0  # how long an id skipped over (its transaction still open) is looked for
MAX_PENDING = 10_000
MAX_LOGGED_IDS = 20  # malformed rows named in one warning
GAP_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300)
RECLAIM_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
START_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

# name -> help. The DESIGN.md names first, then the operational ones.


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
    malformed: int = 0  # rows left out of a figure because a value in them could not be read
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
            self.malformed + other.malformed,
            self.rows + other.rows,
        )


def events(rows: sql.Rows) -> Tally:
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
        histogram, t.malformed = sql.reclaim_latency(
            driver, connection.vendor, cur, rows, RECLAIM_BUCKETS
        )
        t.reclaims = Hist.from_row(histogram)
        if t.malformed:
            # A row anyone planted stays with itself: it is left out of the histogram (never
            # the scrape's failure), counted in jobs_metrics_malformed_events_total, and named
            # here once per process (each row is read once).
            bad = sql.malformed_reclaims(driver, connection.vendor, cur, rows, MAX_LOGGED_IDS)
            logger.warning(
                "metrics: %s expired event(s) without a readable lease_expires_at (a deadline "
                "timestamp not after the next claim) left out of jobs_reclaim_latency_seconds: "
                "jobs_jobevent ids %s%s",
                t.malformed,
                ", ".join(map(str, bad)),
                " ..." if t.malformed > len(bad) else "",
            )
    return t


def rejections(rows: sql.Rows) -> Tally:
    t = Tally()
    with connection.cursor() as cur:
        t.rejected.update(dict(sql.rejected_counts(cur, rows)))
        t.rows = sum(t.rejected.values())
        if t.rows:
            t.wasted = sql.wasted_seconds(driver_for(connection.vendor), cur, rows)
    return t


@contextmanager
def one_snapshot() -> Iterator[None]:
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


class Incremental:
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
        with one_snapshot():
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
        with one_snapshot():
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
