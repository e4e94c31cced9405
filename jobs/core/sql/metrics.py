"""The read-only statements behind /metrics (jobs.ops.metrics decides what they mean).

Owns: SQL text for counting events, rejected writes and the live queue. Never: writes.

Every statement is bounded: the event and rejected-write tallies read a primary-key range
(`id > lo AND id <= hi`) that jobs.ops.metrics keeps short by counting each row once per process;
the queue statement walks the partial index jobs_job_queue_depth_idx (queued rows only, an
index-only scan), the running statement jobs_job_lease_idx (running rows only).
"""

from collections.abc import Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from jobs.core.sql.base import QUEUED, RUNNING, Driver

# Attempt-ending events whose attempt row's outcome is that event (a reaper's terminal reclaim
# writes `expired` and `failed` for one attempt; an operator's requeue of a failed job writes
# `requeued` for an attempt that ended earlier): each ended attempt is observed once.
ENDING = {
    "succeeded": "succeeded",
    "failed": "failed",
    "retry_scheduled": "failed",
    "expired": "expired",
    "released": "released",
}


class Rows:
    """Which rows of a table a tally reads: an id range (lo, hi], or the ids listed."""

    def __init__(self, lo: int = 0, hi: int = 0, ids: Sequence[int] = ()) -> None:
        self.lo, self.hi, self.ids = lo, hi, list(ids)

    def where(self, alias: str) -> tuple[str, list[Any]]:
        if self.ids:
            return f"{alias}.id IN ({', '.join(['%s'] * len(self.ids))})", list(self.ids)
        return f"{alias}.id > %s AND {alias}.id <= %s", [self.lo, self.hi]


def _buckets(expression: str, bounds: Sequence[float]) -> str:
    arms = [f"SUM(CASE WHEN {expression} <= {float(b)!r} THEN 1 ELSE 0 END)" for b in bounds]
    return ", ".join([*arms, "COUNT(*)", f"COALESCE(SUM({expression}), 0)"])


def newest_id_before(cur: CursorWrapper, table: str, cutoff: Any) -> int:
    """The newest id of a row written before `cutoff` (walks the primary key backwards)."""
    cur.execute(f"SELECT id FROM {table} WHERE at < %s ORDER BY id DESC LIMIT 1", [cutoff])
    row = cur.fetchone()
    return int(row[0]) if row else 0


def id_span(cur: CursorWrapper, table: str) -> tuple[int, int]:
    """(oldest id, newest id), 0 for an empty table: two probes of the primary key."""
    cur.execute(
        f"SELECT (SELECT id FROM {table} ORDER BY id LIMIT 1), "
        f"(SELECT id FROM {table} ORDER BY id DESC LIMIT 1)"
    )
    oldest, newest = cur.fetchone()
    return int(oldest or 0), int(newest or 0)


def ids(cur: CursorWrapper, table: str, rows: Rows) -> list[int]:
    where, params = rows.where(table)
    cur.execute(f"SELECT id FROM {table} WHERE {where}", params)
    return [int(r[0]) for r in cur.fetchall()]


def event_counts(cur: CursorWrapper, rows: Rows) -> list[tuple[str, int]]:
    where, params = rows.where("e")
    cur.execute(f"SELECT type, COUNT(*) FROM jobs_jobevent e WHERE {where} GROUP BY type", params)
    return [(r[0], int(r[1])) for r in cur.fetchall()]


def success_attempts(cur: CursorWrapper, rows: Rows) -> list[tuple[int, int]]:
    where, params = rows.where("e")
    cur.execute(
        "SELECT attempt, COUNT(*) FROM jobs_jobevent e "
        f"WHERE {where} AND type = 'succeeded' GROUP BY attempt",
        params,
    )
    return [(int(r[0]), int(r[1])) for r in cur.fetchall()]


def heartbeat_gaps(cur: CursorWrapper, rows: Rows, bounds: Sequence[float]) -> list[Any]:
    """Bucket counts, count and sum of the longest beat gap of each attempt ended in range."""
    where, params = rows.where("e")
    arms = " ".join(f"WHEN '{event}' THEN '{outcome}'" for event, outcome in ENDING.items())
    cur.execute(
        f"SELECT {_buckets('a.heartbeat_gap_max', bounds)} FROM jobs_jobevent e "
        "JOIN jobs_attempt a ON a.job_id = e.job_id AND a.number = e.attempt "
        f"WHERE {where} AND a.heartbeat_gap_max IS NOT NULL "
        f"AND e.type IN ({', '.join(repr(t) for t in ENDING)}) "
        f"AND a.outcome = CASE e.type {arms} END",
        params,
    )
    return list(cur.fetchone())


def start_latency(
    driver: Driver, cur: CursorWrapper, rows: Rows, bounds: Sequence[float]
) -> list[Any]:
    """First claims in range: seconds from the job becoming due (enqueue or run_at) to claim.

    A job whose run_at has moved past its first claim (retried, or reclaimed after its handler
    ran) no longer knows when it first became due, and is left out.
    """
    due = "CASE WHEN j.run_at > j.created_at THEN j.run_at ELSE j.created_at END"
    latency = driver.seconds_between("e.at", due)
    where, params = rows.where("e")
    cur.execute(
        f"SELECT {_buckets(latency, bounds)} FROM jobs_jobevent e "
        "JOIN jobs_job j ON j.id = e.job_id "
        f"WHERE {where} AND e.type = 'claimed' AND e.attempt = 1 AND j.run_at <= e.at",
        params,
    )
    return list(cur.fetchone())


# An expired event's deadline as a timestamp, NULL where its data holds none that reads as one.
# Events are rows anyone can insert: a cast that raises would fail the whole statement, and with
# it every scrape. PostgreSQL 15 has no non-raising cast, but a silent jsonpath suppresses
# datetime errors (strict: an array is not unwrapped); the filter keeps timestamps only (a time
# or a date alone is no deadline).
_PG_DEADLINE = (
    "(jsonb_path_query_first_tz(x.data, "
    "'strict $.lease_expires_at.datetime() ? (@.type() starts with \"timestamp\")', '{}', true) "
    "#>> '{}')::timestamptz"
)
# julianday() answers NULL for text that is no date, but reads a number as a Julian day and
# rolls 02-30 over into March: text only, and its date must come back as it was written.
_SQLITE_DEADLINE = (
    "CASE WHEN json_type(x.data, '$.lease_expires_at') = 'text' "
    "AND date(substr(json_extract(x.data, '$.lease_expires_at'), 1, 10), '+0 days') "
    "= substr(json_extract(x.data, '$.lease_expires_at'), 1, 10) "
    "THEN json_extract(x.data, '$.lease_expires_at') END"
)


def rescued(vendor: str, alias: str) -> str:
    """True for an `expired` event written by a rescue (jobs.worker.rescue: its data says
    `worker_exited`), whatever else the row holds: a rescue ends an attempt before its lease runs
    out, so its deadline falls after the next claim and its silence says nothing of the lease."""
    if vendor == "postgresql":
        return f"COALESCE({alias}.data @> '{{\"worker_exited\": true}}'::jsonb, false)"
    return (
        f"COALESCE(CASE WHEN json_valid({alias}.data) "
        f"THEN json_type({alias}.data, '$.worker_exited') = 'true' END, 0)"
    )


def _reclaims(driver: Driver, vendor: str, rows: Rows) -> tuple[str, list[Any]]:
    """Claims in range that follow an expired attempt, rescues left out: (expired event id,
    latency or NULL).

    The latency is NULL where the deadline cannot be read or falls after the claim (the reaper
    reclaims only a lease that has run out, by the database clock, so only a planted row can).
    A rescue's deadline does fall after the claim: it has no lease-expiry latency to measure.
    """
    deadline = _PG_DEADLINE if vendor == "postgresql" else _SQLITE_DEADLINE
    latency = driver.seconds_between("c.at", deadline)
    where, params = rows.where("c")
    # OFFSET 0: PostgreSQL keeps the subquery, so each row's latency is computed once (flattened,
    # every bucket's reference computed it again: 20,000 reclaims took 200 ms with the plain
    # cast, 1.5 s with the jsonpath read, 80-95 ms so). SQLite has no OFFSET without LIMIT.
    fence = " OFFSET 0" if vendor == "postgresql" else ""
    return (
        "SELECT r.expired_id, CASE WHEN r.seconds >= 0 THEN r.seconds END AS latency FROM ("
        f"SELECT x.id AS expired_id, {latency} AS seconds FROM jobs_jobevent c "
        "JOIN jobs_jobevent x ON x.job_id = c.job_id AND x.attempt = c.attempt - 1 "
        f"AND x.type = 'expired' AND NOT {rescued(vendor, 'x')} "
        f"WHERE {where} AND c.type = 'claimed' AND c.attempt > 1{fence}) r",
        params,
    )


def reclaim_latency(
    driver: Driver, vendor: str, cur: CursorWrapper, rows: Rows, bounds: Sequence[float]
) -> tuple[list[Any], int]:
    """Claims in range that follow an expired attempt: seconds from its lease deadline.

    Returns the histogram row (buckets, count, sum) and how many such claims were left out
    because their expired event holds no readable deadline (`malformed_reclaims` lists them).
    """
    inner, params = _reclaims(driver, vendor, rows)
    arms = [f"SUM(CASE WHEN s.latency <= {float(b)!r} THEN 1 ELSE 0 END)" for b in bounds]
    cur.execute(
        f"SELECT {', '.join(arms)}, COUNT(s.latency), COALESCE(SUM(s.latency), 0), "
        f"COUNT(*) - COUNT(s.latency) FROM ({inner}) s",
        params,
    )
    *histogram, malformed = cur.fetchone()
    return histogram, int(malformed or 0)


def malformed_reclaims(
    driver: Driver, vendor: str, cur: CursorWrapper, rows: Rows, limit: int
) -> list[int]:
    """Ids of expired events in range whose deadline could not be read (for the log)."""
    inner, params = _reclaims(driver, vendor, rows)
    cur.execute(
        f"SELECT s.expired_id FROM ({inner}) s WHERE s.latency IS NULL "
        f"ORDER BY s.expired_id LIMIT {int(limit)}",
        params,
    )
    return [int(r[0]) for r in cur.fetchall()]


def rejected_counts(cur: CursorWrapper, rows: Rows) -> list[tuple[str, int]]:
    where, params = rows.where("r")
    cur.execute(
        f"SELECT write, COUNT(*) FROM jobs_rejectedwrite r WHERE {where} GROUP BY write", params
    )
    return [(r[0], int(r[1])) for r in cur.fetchall()]


def wasted_seconds(driver: Driver, cur: CursorWrapper, rows: Rows) -> float:
    """Runtime of attempts whose commit was rejected: claim -> the rejected commit."""
    where, params = rows.where("r")
    cur.execute(
        f"SELECT COALESCE(SUM({driver.seconds_between('r.at', 'a.claimed_at')}), 0) "
        "FROM jobs_rejectedwrite r "
        "JOIN jobs_attempt a ON a.job_id = r.job_id AND a.number = r.attempt_presented "
        f"WHERE {where} AND r.write = 'commit'",
        params,
    )
    return float(cur.fetchone()[0])


def queues(driver: Driver, cur: CursorWrapper) -> list[tuple[str, int, float | None]]:
    """(queue, queued jobs, seconds the oldest due one has waited) from the partial index."""
    oldest = f"MIN(CASE WHEN run_at <= {driver.now} THEN run_at END)"
    cur.execute(
        f"SELECT queue, COUNT(*), {driver.seconds_between(driver.now, oldest)} "
        f"FROM jobs_job WHERE state = '{QUEUED}' GROUP BY queue"
    )
    return [(r[0], int(r[1]), float(r[2]) if r[2] is not None else None) for r in cur.fetchall()]


def running(driver: Driver, cur: CursorWrapper) -> tuple[int, int]:
    """(running jobs, running jobs whose lease has run out) from jobs_job_lease_idx."""
    cur.execute(
        "SELECT COUNT(*), "
        f"COALESCE(SUM(CASE WHEN lease_expires_at < {driver.now} THEN 1 ELSE 0 END), 0) "
        f"FROM jobs_job WHERE state = '{RUNNING}'"
    )
    row = cur.fetchone()
    return int(row[0]), int(row[1])


def effects_deduplicated(cur: CursorWrapper) -> int:
    cur.execute("SELECT COALESCE(SUM(repeats), 0) FROM jobs_idempotencykey WHERE repeats > 0")
    return int(cur.fetchone()[0])


def recent_attempts(vendor: str, cur: CursorWrapper, limit: int) -> list[tuple[Any, ...]]:
    """The newest ended attempts: (kind, job lease, outcome, longest gap, rescued), for the
    lease hint (`rescued`: expired because its worker process died, not its lease)."""
    arms = " ".join(f"WHEN '{event}' THEN '{outcome}'" for event, outcome in ENDING.items())
    cur.execute(
        "SELECT j.kind, j.lease_seconds, a.outcome, a.heartbeat_gap_max, e.rescued FROM ("
        f"SELECT x.job_id, x.attempt, x.type, {rescued(vendor, 'x')} AS rescued "
        "FROM jobs_jobevent x "
        f"WHERE x.type IN ({', '.join(repr(t) for t in ENDING)}) ORDER BY x.id DESC LIMIT %s) e "
        "JOIN jobs_attempt a ON a.job_id = e.job_id AND a.number = e.attempt "
        f"AND a.outcome = CASE e.type {arms} END "
        "JOIN jobs_job j ON j.id = e.job_id",
        [limit],
    )
    return [tuple(r) for r in cur.fetchall()]
