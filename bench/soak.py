#!/usr/bin/env python
"""Sustained load without decay: a steady stream of no-op jobs for a long time, with retention.

    .venv/bin/python bench/soak.py [--minutes 30] [--rate JOBS_PER_S] [--workers 2]
        [--warmup-minutes 6] [--retention-minutes 5] [--prune-every 60] [--interval 60]
        [--prune-batch 1000] [--prune-pause 0]
        [--vacuum-every 0] [--server URL] [--pg-setting NAME=VALUE ...]
        [--find-capacity [--step-loads 0.2,0.3,...] [--step-minutes 3] [--load 0.7]]

Hours long (on a quiet machine): `bench/soak.py --minutes 480 --warmup-minutes 10`.

The server: by default a PostgreSQL of its own (bench/chaos/pgserver.py: initdb into a temporary
folder, its own port and socket folder, removed at the end) at stock settings -- autovacuum on
with its defaults, default durability (fsync, full_page_writes and synchronous_commit on: the
lines pgserver writes for the chaos suite's speed are overridden), shared_buffers 128MB -- plus
log_autovacuum_min_duration = 0 so that every autovacuum run is in its log; `--pg-setting
max_wal_size=8GB` (repeatable) changes one more line (at stock `max_wal_size`, 1GB, a stream of
a few thousand jobs a second makes the server checkpoint on WAL volume every half minute, and
each checkpoint's full-page writes make more WAL). `--server URL` uses
an existing server instead (this machine's shared one runs with autovacuum off, see below).
The settings that matter are read back with SHOW and printed and written with the results.

What it runs, on a database of its own (palisade_bench_soak, or BENCH_SOAK_DB):

1. The drain: `--measure-jobs` demo.noop jobs inserted, then `manage.py qcluster` (`--workers`
   workers, the default claim batch, up to 64) started; drain = N / (last finish - first
   claim), database clock.
   Measured with `--rate` too (the stream's share of it is printed).
2. The stream: the same qcluster keeps running while a thread enqueues demo.noop jobs at `--rate`
   (default 70 % of the drain just measured), open loop: every 100 ms it inserts the jobs due by
   then, each with its `enqueued` event (the rows `jobs.enqueue()` writes), in one statement.
   Where the stream, the prune and the server share the workers' cores (two cores here), 70 %
   of a drain measured on empty tables is more than the workers keep up with: on 2026-12-06 a
   5,278 jobs/s stream grew a backlog of 277,000 jobs in nine minutes. The soaks of record in
   docs/benchmarks.md give `--rate` (or a lower `--load`) and say which.
   `--find-capacity` measures what the workers keep up with beside the stream instead: before
   the warm-up the stream steps through `--step-loads` (fractions of the drain above),
   `--step-minutes` each, with the prune, autovacuum and the probe running; a step is kept up
   when over its second half the workers finished at least 95 % of the stream and its backlog
   at the end was at most 2 s of it. The capacity is the last step kept up (at step
   resolution: at least that, below the next), and the soak's stream `--load` x the capacity.
3. Retention, as docs/operations.md says to run it: `manage.py jobs prune --older-than-days D`
   every `--prune-every` seconds (start to start, in a thread of its own, like cron; one that
   outlasts the period is followed by the next at once), D = `--retention-minutes` / 1440,
   with `--batch` `--prune-batch` and `--pause` `--prune-pause` (its own defaults: 1000, 0).
4. Every `--interval` seconds (a "minute") it records, after `--warmup-minutes` of the stream:
   - claim p50 / p99: Palisade's own claim statement (jobs.core.sql.PostgresDriver, batch 8)
     timed on a side connection every 0.25 s, inside a transaction that is rolled back (it claims
     nothing for good; each probe leaves a few dead tuples, negligible beside the stream);
   - enqueued/s and drained/s (jobs whose finished_at falls in the minute), their run_at ->
     finished_at latency p50 / p99, and the backlog (queued jobs due);
   - per job table (jobs_job, jobs_attempt, jobs_jobevent, and django-q2's broker tables):
     live and dead tuples (dead: the mean of samples every 5 s, autovacuum makes it a sawtooth;
     also the minute's largest), heap size, indexes size (pg_stat_user_tables,
     pg_relation_size, pg_indexes_size), each index's size, and autovacuum / autoanalyze runs
     in the minute;
   - the jobs pruned in the minute and the machine's 1-minute load average (other work on the
     machine shows there: read a slow minute beside it).
   - what the server's backends were doing (bench/activity.py: pg_stat_activity every second,
     the waits seen among running statements and the longest statements); a row whose
     end-to-end p50 is above 0.5 s prints it.
   - the jobs finished in each second of the minute, the claim probe's slowest, and the
     server's WAL (records, bytes, full-page images, syncs) and checkpoints in the minute;
   - with `--pg-setting shared_preload_libraries=pg_stat_statements`, the minute's six
     statements that took the most execution time (calls, total and mean milliseconds).
   Where the server runs with autovacuum off (this machine's PostgreSQL does: a CI setting),
   it says so; `--vacuum-every S` then runs VACUUM (ANALYZE) of the job tables every S seconds in
   its stead (its runs are the `vacuum_runs` figures).
5. The verdict: the mean of the last `--window` minutes (default 5, at most half the run) over
   the mean of the first `--window`, for every figure; the target is within 20 %.

Prints a table per minute and the verdict, and writes every raw number to bench/results/.
`--verdict-of bench/results/soak.json --from-row 6` prints the verdict of a run already written
from its sixth row (a warm-up that was still catching up is then left out).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.activity import ActivitySampler, describe  # noqa: E402
from bench.chaos.pgserver import PrivatePostgres  # noqa: E402
from bench.protocol import (  # noqa: E402
    RESULTS_DIR,
    percentile,
    spawn,
    stop,
    stop_all,
    uptime,
    wait_for,
)
from bench.systems import palisade_database, write_report  # noqa: E402

DB = os.environ.get("BENCH_SOAK_DB", "palisade_bench_soak")
TABLES = ("jobs_job", "jobs_attempt", "jobs_jobevent", "django_q_ormq", "django_q_task")
TOLERANCE = 0.20

STREAM = """
WITH j AS (
    INSERT INTO jobs_job (kind) SELECT 'demo.noop' FROM generate_series(1, %(n)s) RETURNING id
)
INSERT INTO jobs_jobevent (job_id, attempt, type, worker, data)
SELECT id, 0, 'enqueued', '', '{}' FROM j
"""
TABLE_STATS = """
SELECT relname, n_live_tup, n_dead_tup, pg_relation_size(relid), pg_indexes_size(relid),
       autovacuum_count, autoanalyze_count, vacuum_count
  FROM pg_stat_user_tables WHERE relname = ANY(%s)
"""
DEAD = "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE relname = ANY(%s)"
FINISHED = """
SELECT count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - run_at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - run_at))
  FROM jobs_job WHERE finished_at >= %s AND finished_at < %s
"""
# The minute's jobs by the second they finished in: a minute that collapsed shows whether the
# drain stopped at once (a lock, a stall) or slowed throughout.
PER_SECOND = """
SELECT floor(extract(epoch FROM finished_at - %(start)s))::int, count(*)
  FROM jobs_job WHERE finished_at >= %(start)s AND finished_at < %(end)s GROUP BY 1 ORDER BY 1
"""
# Stock settings but for the lines pgserver.py writes for the chaos suite's speed (fsync and
# full_page_writes off): later lines of postgresql.conf win. Logging autovacuum changes nothing
# it does and shows each run.
OWN_SERVER_CONF = """
# bench/soak.py: stock durability, autovacuum on at its defaults
fsync = on
full_page_writes = on
synchronous_commit = on
autovacuum = on
log_autovacuum_min_duration = 0
log_min_messages = warning
"""
SETTINGS = (
    "server_version", "autovacuum", "autovacuum_naptime", "autovacuum_max_workers",
    "autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_analyze_scale_factor", "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit", "vacuum_cost_limit", "maintenance_work_mem", "fsync",
    "full_page_writes", "synchronous_commit", "wal_level", "shared_buffers", "max_wal_size",
    "checkpoint_timeout", "max_connections", "wal_compression",
)  # fmt: skip
# A row whose end-to-end p50 is above this prints what the server's backends did in it.
SLOW_MINUTE_MS = 500.0
INDEX_SIZES = """
SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
 WHERE relname = ANY(%s)
"""


class Stream(threading.Thread):
    """Open-loop enqueuer: inserts the jobs due by now every tick, never catching up a burst."""

    def __init__(self, dsn: str, rate: float, tick: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.dsn, self.tick = dsn, tick
        self.sent = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.set_rate(rate)  # started right after it is made: the pace counts from here

    def set_rate(self, rate: float) -> None:
        """From now on, `rate` jobs/s (what was due before and not sent is dropped)."""
        self._pace = (time.monotonic(), self.sent, rate)  # since when, sent then, rate: one
        # assignment, read whole by the thread

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopping.wait(self.tick):
                    since, sent_then, rate = self._pace
                    due = sent_then + int(rate * (time.monotonic() - since)) - self.sent
                    # After a stall, at most five ticks' worth at once: a stream, not a flood.
                    n = min(due, max(1, int(rate * self.tick * 5)))
                    if n > 0:
                        conn.execute(STREAM, {"n": n})
                        self.sent += n
        except BaseException as exc:  # noqa: BLE001 -- the main loop reports it and stops
            self.error = exc


class ClaimProbe(threading.Thread):
    """Times Palisade's claim statement on a side connection; every claim is rolled back."""

    def __init__(self, dsn: str, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.dsn, self.every = dsn, every
        self.samples: list[float] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def take(self) -> list[float]:
        taken, self.samples = self.samples, []
        return taken

    def run(self) -> None:
        from jobs.core.sql import PostgresDriver

        driver = PostgresDriver()
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopping.wait(self.every):
                    with conn.transaction(force_rollback=True), conn.cursor() as cur:
                        began = time.perf_counter()
                        driver.claim(cur, "soak-probe:0", 8, 30.0, None, {})  # type: ignore[arg-type]
                        self.samples.append((time.perf_counter() - began) * 1000)
        except BaseException as exc:  # noqa: BLE001 -- the main loop reports it and stops
            self.error = exc


class Vacuumer(threading.Thread):
    """`--vacuum-every`: plain VACUUM (ANALYZE) of the job tables, for a server whose autovacuum
    is off (a CI configuration): what autovacuum would do, on a fixed period instead."""

    def __init__(self, dsn: str, every: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.every = dsn, every
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopping.wait(self.every):
                    for table in TABLES[:3]:
                        conn.execute(f"VACUUM (ANALYZE) {table}")
        except BaseException as exc:  # noqa: BLE001 -- the main loop reports it and stops
            self.error = exc


# The server's WAL and checkpoints since it started: a minute's share is the difference from the
# row before (full-page images follow each checkpoint, and a vacuum of a large table makes many).
SERVER_COUNTERS = """
SELECT w.wal_records, w.wal_fpi, w.wal_bytes::bigint, w.wal_write, w.wal_sync,
       b.checkpoints_timed, b.checkpoints_req
  FROM pg_stat_wal w, pg_stat_bgwriter b
"""
SERVER_NAMES = (
    "wal_records", "wal_fpi", "wal_bytes", "wal_write", "wal_sync",
    "checkpoints_timed", "checkpoints_req",
)  # fmt: skip


def server_counters(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(zip(SERVER_NAMES, conn.execute(SERVER_COUNTERS).fetchone(), strict=True))


# With `--pg-setting shared_preload_libraries=pg_stat_statements`: each statement's calls and
# execution time in the minute, so a slow minute says which statements took longer (the claim,
# the commit, the enqueue, the prune) -- not only that the machine was busy.
STATEMENTS = """
SELECT queryid, calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 100)
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
TOP_STATEMENTS = 6


def statements_on(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server preloads pg_stat_statements (then its view is created here)."""
    preload = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
    if "pg_stat_statements" not in preload:
        return False
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


def statement_totals(conn: psycopg.Connection[Any]) -> dict[int, tuple[int, float, str]]:
    return {qid: (calls, ms, text) for qid, calls, ms, text in conn.execute(STATEMENTS)}


def statement_deltas(
    now: dict[int, tuple[int, float, str]], before: dict[int, tuple[int, float, str]]
) -> list[dict[str, Any]]:
    """The minute's statements by execution time: calls, total and mean milliseconds."""
    out = []
    for qid, (calls, ms, text) in now.items():
        calls_before, ms_before, _ = before.get(qid, (0, 0.0, text))
        if calls > calls_before:
            n, total = calls - calls_before, ms - ms_before
            out.append({"calls": n, "total_ms": round(total, 1), "mean_ms": total / n})
            out[-1]["query"] = text
    out.sort(key=lambda st: st["total_ms"], reverse=True)
    return out[:TOP_STATEMENTS]


def table_figures(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    tables = {
        r[0]: {
            "live": r[1],
            "dead": r[2],
            "heap_bytes": r[3],
            "indexes_bytes": r[4],
            "autovacuum_count": r[5],
            "autoanalyze_count": r[6],
            "vacuum_count": r[7],
        }
        for r in conn.execute(TABLE_STATS, [list(TABLES)]).fetchall()
    }
    indexes = dict(conn.execute(INDEX_SIZES, [list(TABLES)]).fetchall())
    return {"tables": tables, "indexes": indexes}


def measure_drain(conn: psycopg.Connection[Any], n: int, procs: list[Any]) -> float:
    conn.execute(STREAM, {"n": n})
    conn.execute("VACUUM ANALYZE jobs_job")
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM jobs_job WHERE state = 'queued'").fetchone()[0] == 0
            and conn.execute("SELECT count(*) FROM jobs_job WHERE state = 'running'").fetchone()[0]
            == 0
        ),
        timeout=600,
        what="the first drain",
        procs=procs,
        interval=0.1,
    )
    first, last = conn.execute("SELECT min(claimed_at), max(ended_at) FROM jobs_attempt").fetchone()
    return n / (last - first).total_seconds()


# A capacity step kept up when, over its second half, the workers finished at least this share
# of the stream, and the backlog at its end was at most this many seconds of the stream.
KEPT_UP_SHARE = 0.95
KEPT_UP_BACKLOG_SECONDS = 2.0
BACKLOG = "SELECT count(*) FROM jobs_job WHERE state = 'queued' AND run_at <= now()"
FINISHED_SINCE = "SELECT count(*) FROM jobs_job WHERE finished_at >= %s AND finished_at < %s"


def find_capacity(
    conn: psycopg.Connection[Any],
    stream: Stream,
    drain: float,
    loads: Sequence[float],
    step_seconds: float,
    healthy: Callable[[], None],
) -> tuple[float | None, list[dict[str, Any]]]:
    """The highest stream the workers keep up with, everything of the soak running beside them
    (the stream's inserts, the prune, autovacuum, the probe): the stream steps through `loads`
    (fractions of the drain measured on empty tables), `step_seconds` each, and stops at the
    first step not kept up (KEPT_UP_SHARE, KEPT_UP_BACKLOG_SECONDS). Returns the last rate kept
    up (None if the first was not) and every step's figures. At step resolution: the capacity
    is at least that rate and below the next step's."""
    steps: list[dict[str, Any]] = []
    capacity: float | None = None
    for load in loads:
        rate = drain * load
        stream.set_rate(rate)
        began = time.monotonic()
        half_at = None
        while time.monotonic() - began < step_seconds:
            healthy()
            if half_at is None and time.monotonic() - began >= step_seconds / 2:
                half_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            time.sleep(0.5)
        end_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        finished = conn.execute(FINISHED_SINCE, [half_at, end_at]).fetchone()[0]
        backlog = conn.execute(BACKLOG).fetchone()[0]
        drained = finished / (end_at - half_at).total_seconds()
        kept_up = drained >= KEPT_UP_SHARE * rate and backlog <= KEPT_UP_BACKLOG_SECONDS * rate
        steps.append({
            "load": load, "rate": round(rate, 1), "drained_per_s": round(drained, 1),
            "backlog": backlog, "kept_up": kept_up,
        })  # fmt: skip
        print(f"capacity step: stream {rate:.0f} jobs/s ({load:.0%} of the drain): drained "
              f"{drained:.0f}/s in its second half, backlog {backlog} at its end: "
              f"{'kept up' if kept_up else 'fell behind'}", flush=True)  # fmt: skip
        if not kept_up:
            break
        capacity = rate
    return capacity, steps


class Pruner(threading.Thread):
    """Retention as cron would run it: `manage.py jobs prune` every `every` seconds (start to
    start); a prune that outlasts the period is followed by the next one at once, never two."""

    def __init__(
        self, env: dict[str, str], days: float, every: float, batch: int, pause: float
    ) -> None:
        super().__init__(daemon=True)
        self.env, self.days, self.every = env, days, every
        self.batch, self.pause = batch, pause
        self.runs: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        import subprocess

        try:
            while not self.stopping.wait(max(0.0, self.every - self.last_seconds())):
                began = time.monotonic()
                out = subprocess.run(
                    [sys.executable, "manage.py", "jobs", "prune",
                     f"--older-than-days={self.days!r}", f"--batch={self.batch}",
                     f"--pause={self.pause!r}"],
                    cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=3600,
                )  # fmt: skip
                if out.returncode != 0:
                    raise RuntimeError(f"prune failed: {out.stderr[-2000:]}")
                said = out.stdout.strip()
                found = re.search(r"pruned (\d+) finished jobs", said)
                self.runs.append({
                    "ended": time.monotonic(),
                    "seconds": round(time.monotonic() - began, 2),
                    "jobs": int(found.group(1)) if found else 0,
                    "said": said,
                })  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 -- the main loop reports it and stops
            self.error = exc

    def last_seconds(self) -> float:
        return self.runs[-1]["seconds"] if self.runs else 0.0


def sample_dead(conn: psycopg.Connection[Any], last: dict[str, Any]) -> None:
    """One sample of each table's dead tuples (n_dead_tup), kept for the minute's mean and max."""
    for name, dead in conn.execute(DEAD, [list(TABLES)]).fetchall():
        last["dead_samples"].setdefault(name, []).append(dead)


def minute(
    conn: psycopg.Connection[Any],
    probe: ClaimProbe,
    stream: Stream,
    pruner: Pruner,
    last: dict[str, Any],
    activity: ActivitySampler,
) -> dict[str, Any]:
    """One row of the report: the figures since the previous row (`last`, updated in place)."""
    db_now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    drained, e2e_p50, e2e_p99 = conn.execute(FINISHED, [last["db_now"], db_now]).fetchone()
    backlog = conn.execute(
        "SELECT count(*) FROM jobs_job WHERE state = 'queued' AND run_at <= clock_timestamp()"
    ).fetchone()[0]
    seconds = (db_now - last["db_now"]).total_seconds()
    per_second = [0] * max(1, int(seconds) + 1)
    for second, count in conn.execute(
        PER_SECOND, {"start": last["db_now"], "end": db_now}
    ).fetchall():
        per_second[min(second, len(per_second) - 1)] += count
    claims = probe.take()
    sample_dead(conn, last)
    figures = table_figures(conn)
    prunes = pruner.runs[last["prunes"] :]
    row = {
        "at": db_now.isoformat(),
        "seconds": round(seconds, 2),
        "load1": round(os.getloadavg()[0], 2),
        "enqueued_per_s": (stream.sent - last["sent"]) / seconds,
        "drained_per_s": drained / seconds,
        "e2e_ms": {
            "p50": (e2e_p50 or 0.0) * 1000,
            "p99": (e2e_p99 or 0.0) * 1000,
        },
        "backlog": backlog,
        "finished_by_second": per_second,
        "claim_ms": {
            "p50": percentile(claims, 0.5),
            "p99": percentile(claims, 0.99),
            "max": max(claims, default=0.0),
            "n": len(claims),
        },
        "pruned": {
            "runs": len(prunes),
            "jobs": sum(r["jobs"] for r in prunes),
            "seconds": round(sum(r["seconds"] for r in prunes), 2),
        },
        **figures,
        "activity": activity.take(),
    }
    counters = server_counters(conn)
    row["server"] = {k: v - last["server"].get(k, v) for k, v in counters.items()}
    statements = statement_totals(conn) if last.get("statements") is not None else None
    if statements is not None:
        row["statements"] = statement_deltas(statements, last["statements"])
    for name, t in figures["tables"].items():
        before = last["tables"].get(name, t)
        samples = last["dead_samples"].get(name) or [t["dead"]]
        t["dead_mean"] = sum(samples) / len(samples)
        t["dead_max"] = max(samples)
        t["autovacuum_runs"] = t["autovacuum_count"] - before["autovacuum_count"]
        t["autoanalyze_runs"] = t["autoanalyze_count"] - before["autoanalyze_count"]
        t["vacuum_runs"] = t["vacuum_count"] - before["vacuum_count"]
    last.update(
        db_now=db_now,
        sent=stream.sent,
        tables=figures["tables"],
        server=counters,
        statements=statements,
        prunes=last["prunes"] + len(prunes),
        dead_samples={},
    )
    return row


def flat(row: dict[str, Any]) -> dict[str, float]:
    """Every figure of a row under one name, for the first/last comparison."""
    out = {
        "claim p50 ms": row["claim_ms"]["p50"],
        "claim p99 ms": row["claim_ms"]["p99"],
        "drained/s": row["drained_per_s"],
        "run_at->finished p50 ms": row["e2e_ms"]["p50"],
        "run_at->finished p99 ms": row["e2e_ms"]["p99"],
        "backlog": row["backlog"],
        "pruned jobs": row["pruned"]["jobs"],
        "prune seconds": row["pruned"]["seconds"],
    }
    for name, t in sorted(row["tables"].items()):
        for key in ("live", "dead_mean", "heap_bytes", "indexes_bytes", "autovacuum_runs",
                    "autovacuum_seconds", "vacuum_runs"):  # fmt: skip
            out[f"{name} {key}"] = t.get(key, 0)
    for name, size in sorted(row["indexes"].items()):
        out[f"index {name} bytes"] = size
    return out


# Below these on both sides a figure is negligible whatever its ratio (a django-q2 table's 10
# dead tuples becoming 30 is not decay): tuples, bytes, seconds of autovacuum per minute.
FLOORS = {" live": 1000, " dead_mean": 1000, " bytes": 2**20, " autovacuum_seconds": 0.5}


def verdict(rows: list[dict[str, Any]], window: int) -> list[dict[str, Any]]:
    firsts, lasts = [flat(r) for r in rows[:window]], [flat(r) for r in rows[-window:]]
    out = []
    for name in firsts[0]:
        a = sum(f[name] for f in firsts) / len(firsts)
        b = sum(f.get(name, 0) for f in lasts) / len(lasts)
        ratio = b / a if a else (1.0 if b == 0 else float("inf"))
        floor = next((v for k, v in FLOORS.items() if name.endswith(k)), 0)
        negligible = max(a, b) < floor
        out.append({"figure": name, "first": a, "last": b, "ratio": ratio,
                    "negligible": negligible,
                    "within": negligible or abs(ratio - 1) <= TOLERANCE})  # fmt: skip
    return out


def print_verdict(compared: list[dict[str, Any]], window: int, first_row: int = 1) -> None:
    print(f"\nlast {window} rows over the {window} from row {first_row}"
          f" (target: within {TOLERANCE:.0%}):")  # fmt: skip
    for c in compared:
        mark = "n/a" if c["negligible"] else "ok " if c["within"] else "OUT"
        scale, unit = (2**20, " MB") if c["figure"].endswith("bytes") else (1, "")
        print(f"  {mark} {c['figure'].removesuffix(' bytes'):<48} {c['first'] / scale:>12.2f}"
              f" -> {c['last'] / scale:>12.2f}{unit}  x{c['ratio']:.2f}")  # fmt: skip


def reread(path: Path, first_row: int, window: int) -> None:
    """`--verdict-of`: the verdict of a run already written, its first rows left out (a warm-up
    that was not yet a steady state), without running anything."""
    import json

    rows = json.loads(path.read_text())["rows"][first_row - 1 :]
    if len(rows) < 2:
        raise SystemExit(f"{path}: fewer than two rows from row {first_row}")
    window = max(1, min(window, len(rows) // 2))
    print_verdict(verdict(rows, window), window, first_row)


def autovacuum_seconds(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    """Each row's autovacuum time per table: the runs (from the log) that ended in its minute."""
    for row in rows:
        end = datetime.fromisoformat(row["at"])
        begin = end.timestamp() - row["seconds"]
        for name, t in row["tables"].items():
            t["autovacuum_seconds"] = round(
                sum(
                    r.get("seconds", 0.0)
                    for r in runs
                    if r["table"] == name
                    and begin
                    <= datetime.fromisoformat(r["at"] + "+00:00").timestamp()
                    < end.timestamp()
                ),
                2,
            )


def mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def print_rows(rows: list[dict[str, Any]], first: int = 1) -> None:
    if first == 1:
        head = "row load1  enq/s drain/s backlog  claim p50/p99 ms   e2e p50/p99 ms pruned"
        for t in ("jobs_job", "jobs_attempt", "jobs_jobevent"):
            head += f" | {t[5:]:>9} heapMB idxMB av"
        print(head + "   (mean dead tuples, sizes, autovacuum runs)")
    for i, r in enumerate(rows, first):
        line = (
            f"{i:3d} {r['load1']:5.2f} {r['enqueued_per_s']:6.0f} {r['drained_per_s']:7.0f}"
            f" {r['backlog']:7d} {r['claim_ms']['p50']:7.2f}/{r['claim_ms']['p99']:7.2f}"
            f" {r['e2e_ms']['p50']:7.1f}/{r['e2e_ms']['p99']:7.1f} {r['pruned']['jobs']:6d}"
        )
        for name in ("jobs_job", "jobs_attempt", "jobs_jobevent"):
            t = r["tables"].get(name, {})
            line += (
                f" | {t.get('dead_mean', 0):>9.0f} {mb(t.get('heap_bytes', 0)):>6}"
                f" {mb(t.get('indexes_bytes', 0)):>5} {t.get('autovacuum_runs', 0):2d}"
            )
        print(line, flush=True)


AUTOVACUUM_RUN = re.compile(
    r"^(?P<at>\S+ \S+) UTC \[\d+\] LOG:  automatic vacuum of table \"[^\"]*\.public\."
    r"(?P<table>\w+)\": index scans: (?P<index_scans>\d+)$"
)
REMOVED = re.compile(r"tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable")
ELAPSED = re.compile(r"elapsed: ([\d.]+) s")


def autovacuum_runs(log: str) -> list[dict[str, Any]]:
    """Every `automatic vacuum` of a job table in the server's log (log_autovacuum_min_duration
    = 0): when, index scans, tuples removed / remaining / dead but not yet removable, seconds."""
    runs: list[dict[str, Any]] = []
    for line in log.splitlines():
        found = AUTOVACUUM_RUN.match(line)
        if found and found["table"] in TABLES:
            runs.append({"at": found["at"], "table": found["table"],
                         "index_scans": int(found["index_scans"])})  # fmt: skip
        elif runs and line.startswith("\t") and "seconds" not in runs[-1]:
            if removed := REMOVED.search(line):
                runs[-1].update(removed=int(removed[1]), remain=int(removed[2]),
                                not_removable=int(removed[3]))  # fmt: skip
            elif elapsed := ELAPSED.search(line):
                runs[-1]["seconds"] = float(elapsed[1])
    return runs


def own_server(changed: Sequence[str] = ()) -> PrivatePostgres:
    """A PostgreSQL of the soak's own at stock settings (see the module docstring), but for the
    `--pg-setting NAME=VALUE`s given."""
    pg = PrivatePostgres().init()
    with open(pg.data / "postgresql.conf", "a") as conf:
        conf.write(OWN_SERVER_CONF)
        for setting in changed:
            name, value = setting.split("=", 1)
            conf.write(f"{name} = '{value}'\n")
    pg.start()
    return pg


def loads(text: str) -> tuple[float, ...]:
    """`0.2,0.3,...`: rising fractions, each in (0, 2]."""
    try:
        found = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not found or any(not 0 < x <= 2 for x in found) or list(found) != sorted(set(found)):
        raise argparse.ArgumentTypeError(f"fractions in (0, 2], rising: {text!r}")
    return found


def pg_setting(text: str) -> str:
    """NAME=VALUE for postgresql.conf: a name (dotted for an extension's: auto_explain.x) and a
    plain word or comma list (written quoted)."""
    if not re.fullmatch(r"[a-z_][a-z_.]{0,62}=[A-Za-z0-9_.,]{1,64}", text):
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=VALUE, e.g. max_wal_size=8GB")
    return text


def server_settings(conn: psycopg.Connection[Any]) -> dict[str, str]:
    return {
        name: conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0] for name in SETTINGS
    }


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="measured minutes (after warm-up)")
    p.add_argument("--warmup-minutes", type=float, default=6.0, help="stream before measuring")
    p.add_argument(
        "--rate", type=float, default=None, help="jobs/s (default: --load x the drain measured)"
    )
    p.add_argument(
        "--load", type=float, default=0.7,
        help="fraction of the measured drain (with --find-capacity: of the capacity found)",
    )  # fmt: skip
    p.add_argument(
        "--find-capacity", action="store_true",
        help="first step the stream through --step-loads to find the highest it keeps up with "
        "(everything of the soak beside it), then soak at --load x that",
    )  # fmt: skip
    p.add_argument(
        "--step-loads", type=loads, default=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
        help="with --find-capacity: the steps, fractions of the drain on empty tables, rising "
        "(default 0.2,0.3,0.4,0.5,0.6,0.7)",
    )  # fmt: skip
    p.add_argument("--step-minutes", type=float, default=3.0, help="with --find-capacity")
    p.add_argument("--measure-jobs", type=int, default=4000, help="jobs for the first drain")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--retention-minutes", type=float, default=5.0, help="prune's cut-off")
    p.add_argument("--prune-every", type=float, default=60.0, help="seconds between prunes")
    p.add_argument("--prune-batch", type=int, default=1000, help="prune's --batch (jobs a txn)")
    p.add_argument("--prune-pause", type=float, default=0.0, help="prune's --pause between batches")
    p.add_argument("--interval", type=float, default=60.0, help="seconds per report row")
    p.add_argument(
        "--vacuum-every", type=float, default=0.0,
        help="seconds between VACUUMs of the job tables (0: leave it to autovacuum)",
    )  # fmt: skip
    p.add_argument("--window", type=int, default=5, help="rows compared, first and last")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG"),
        help="an existing server, postgres://user@host:port (default: one of its own, stock "
        "settings)",
    )  # fmt: skip
    p.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        type=pg_setting,
        metavar="NAME=VALUE",
        help="own server only: a postgresql.conf line beyond stock (repeatable), e.g. "
        "max_wal_size=8GB",
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "soak.json")
    p.add_argument("--verdict-of", type=Path, help="re-read a results JSON: its verdict only")
    p.add_argument("--from-row", type=int, default=1, help="with --verdict-of: the first row")
    args = p.parse_args()
    if args.verdict_of is not None:
        if args.from_row < 1:
            p.error("--from-row must be at least 1")
        reread(args.verdict_of, args.from_row, args.window)
        return
    rows_wanted = int(args.minutes * 60 // args.interval)
    if args.rate is not None and args.rate <= 0 or rows_wanted < 2 or args.prune_every <= 0:
        p.error("--rate must be positive, --minutes at least two --interval, --prune-every > 0")
    if not 1 <= args.prune_batch <= 10_000 or not 0 <= args.prune_pause <= 3600:
        p.error("--prune-batch must be 1..10000, --prune-pause 0..3600 (as prune takes them)")
    if args.retention_minutes * 60 < args.interval:
        p.error("--retention-minutes must cover one --interval (drained jobs are counted late)")
    if args.find_capacity and (args.rate is not None or args.step_minutes * 60 < 20):
        p.error("--find-capacity sets the rate itself (no --rate); --step-minutes >= 1/3")
    if args.find_capacity and args.retention_minutes < args.step_minutes:
        p.error("--retention-minutes must cover a --step-minutes (a step counts its jobs finished)")
    if args.interval < 10 or args.vacuum_every < 0 or args.workers < 1:
        p.error("--interval must be at least 10 s, --vacuum-every >= 0, --workers >= 1")
    window = max(1, min(args.window, rows_wanted // 2))
    # SIGTERM (kill, nohup's end) unwinds like Ctrl-C: children stopped, own server removed.
    signal.signal(signal.SIGTERM, interrupted)
    started, load_start = datetime.now(UTC), uptime()
    print(f"machine: {load_start}")
    pg: PrivatePostgres | None = None
    try:
        if args.server is None:
            pg = own_server(args.pg_setting)
            server = f"postgres://postgres@127.0.0.1:{pg.port}"
            print(f"own server: {server} (data in {pg.data}, log {pg.log})")
        else:
            server = args.server.rstrip("/")
        run(args, server, rows_wanted, window, started, load_start, pg)
    finally:
        stop_all()  # whatever run() spawned, however it ended
        if pg is not None:
            if pg.log.exists():  # kept for reading after the folder is gone
                (RESULTS_DIR / "logs").mkdir(parents=True, exist_ok=True)
                shutil.copyfile(pg.log, RESULTS_DIR / "logs" / "soak-server.log")
            pg.remove()


def run(
    args: argparse.Namespace,
    server: str,
    rows_wanted: int,
    window: int,
    started: datetime,
    load_start: str,
    pg: PrivatePostgres | None,
) -> None:
    env = palisade_database(server, DB, JOBS_WORKERS=str(args.workers))
    dsn = f"{server}/{DB}"
    conn = psycopg.connect(dsn, autocommit=True)
    settings = server_settings(conn)
    stock = "stock settings" + (f" but {', '.join(args.pg_setting)}" if args.pg_setting else "")
    print("server: " + (f"own ({stock}), " if pg else f"{server}, ")
          + ", ".join(f"{k}={v}" for k, v in settings.items()))  # fmt: skip
    autovacuum = settings["autovacuum"]
    if autovacuum != "on" and not args.vacuum_every:
        print("WARNING: this server runs with autovacuum = off: dead tuples are never reclaimed")
        print("         and tables only grow; see --vacuum-every")
    cluster = spawn(
        [sys.executable, "manage.py", "qcluster"], env, RESULTS_DIR / "logs" / "soak-qcluster.log"
    )
    stream: Stream | None = None
    probe: ClaimProbe | None = None
    pruner: Pruner | None = None
    vacuumer: Vacuumer | None = None
    activity: ActivitySampler | None = None
    rows: list[dict[str, Any]] = []
    capacity: float | None = None
    steps: list[dict[str, Any]] = []
    try:
        drain = measure_drain(conn, args.measure_jobs, [cluster])
        print(f"drain: {drain:.0f} jobs/s ({args.measure_jobs} jobs, {args.workers} workers)")
        rate = args.rate if args.rate is not None else drain * args.load
        if args.find_capacity:
            rate = drain * args.step_loads[0]
        else:
            print(f"stream: {rate:.0f} jobs/s ({rate / drain:.0%} of the drain); "
                  f"warm-up {args.warmup_minutes:g} min, "
                  f"then {rows_wanted} rows of {args.interval:g} s", flush=True)  # fmt: skip
        stream, probe = Stream(dsn, rate), ClaimProbe(dsn)
        pruner = Pruner(
            env, args.retention_minutes / 1440, args.prune_every, args.prune_batch, args.prune_pause
        )
        vacuumer = Vacuumer(dsn, args.vacuum_every) if args.vacuum_every else None
        activity = ActivitySampler(dsn)
        for thread in (stream, probe, pruner, vacuumer, activity):
            if thread is not None:
                thread.start()

        def healthy() -> None:
            failed = (
                stream.error or probe.error or pruner.error or activity.error
                or (vacuumer and vacuumer.error)
            )  # fmt: skip
            if failed or cluster.poll() is not None:
                raise RuntimeError(f"stopped: {failed or 'qcluster exited'}")

        if args.find_capacity:
            capacity, steps = find_capacity(
                conn, stream, drain, args.step_loads, args.step_minutes * 60, healthy
            )
            if capacity is None:
                raise SystemExit(
                    f"the first capacity step ({args.step_loads[0]:.0%} of the drain) already "
                    "fell behind: start lower (--step-loads)"
                )
            rate = capacity * args.load
            stream.set_rate(rate)
            last_kept = steps[-1]["kept_up"]
            print(f"capacity beside the stream: {'at least ' if last_kept else ''}"
                  f"{capacity:.0f} jobs/s ({capacity / drain:.0%} of the drain on empty tables)"
                  f"; stream: {rate:.0f} jobs/s ({args.load:.0%} of it, {rate / drain:.0%} of "
                  f"the drain); warm-up {args.warmup_minutes:g} min, then {rows_wanted} rows of "
                  f"{args.interval:g} s", flush=True)  # fmt: skip
        measuring_at = time.monotonic() + args.warmup_minutes * 60
        next_sample = time.monotonic()
        last: dict[str, Any] = {}
        while len(rows) < rows_wanted:
            healthy()
            if time.monotonic() < measuring_at:
                if last and time.monotonic() >= next_sample:
                    sample_dead(conn, last)
                    next_sample = time.monotonic() + 5.0
                time.sleep(max(0.0, min(0.2, measuring_at - time.monotonic())))
                continue
            if not last:
                probe.take()
                activity.take()
                last = {
                    "db_now": conn.execute("SELECT clock_timestamp()").fetchone()[0],
                    "sent": stream.sent,
                    "tables": table_figures(conn)["tables"],
                    "server": server_counters(conn),
                    "statements": statement_totals(conn) if statements_on(conn) else None,
                    "prunes": len(pruner.runs),
                    "dead_samples": {},
                }
            else:
                rows.append(minute(conn, probe, stream, pruner, last, activity))
                print_rows(rows[-1:], first=len(rows))
                if rows[-1]["e2e_ms"]["p50"] > SLOW_MINUTE_MS:
                    print(f"     slow minute: {describe(rows[-1]['activity'])}", flush=True)
                    done = " ".join(str(n) for n in rows[-1]["finished_by_second"])
                    print(f"     finished per second: {done}", flush=True)
                    server = rows[-1]["server"]
                    print(
                        f"     server: WAL {server['wal_bytes'] / 2**20:.0f} MB,"
                        f" {server['wal_fpi']} full-page images, {server['wal_sync']} syncs,"
                        f" checkpoints {server['checkpoints_timed']} timed"
                        f" + {server['checkpoints_req']} requested",
                        flush=True,
                    )
                    for st in rows[-1].get("statements", []):
                        print(
                            f"     {st['total_ms']:9.0f} ms {st['calls']:7d} calls"
                            f" {st['mean_ms']:7.2f} ms each: {st['query'][:70]}",
                            flush=True,
                        )
            measuring_at = max(measuring_at + args.interval, time.monotonic() + 1)
    finally:
        for thread in (stream, probe, pruner, vacuumer, activity):
            if thread is not None:
                thread.stopping.set()
        # The cluster first: a second Ctrl-C in the joins below (timeout(1) relays one) must not
        # leave it running against a server that main() then removes -- an orphan that retries
        # its connection for good, on the cores the next benchmark measures.
        stop(cluster)
        for thread in (stream, probe, pruner, vacuumer, activity):
            if thread is not None:
                thread.join(timeout=120)
        conn.close()
    prunes = pruner.runs if pruner is not None else []
    autovacuum_log: list[dict[str, Any]] = []
    if pg is not None and pg.log.exists():
        autovacuum_log = autovacuum_runs(pg.log.read_text(errors="replace"))
        autovacuum_seconds(rows, autovacuum_log)
    compared = verdict(rows, window)
    print_verdict(compared, window)
    print(f"prunes: {len(prunes)}, last: {prunes[-1]['said'] if prunes else 'none'}")
    for table in TABLES[:3]:
        took = [r["seconds"] for r in autovacuum_log if r["table"] == table and "seconds" in r]
        print(f"autovacuum of {table}: {len(took)} runs in the server's log, "
              f"{sum(took):.1f} s in all, longest {max(took, default=0):.1f} s")  # fmt: skip
    print(f"machine: {uptime()}")
    write_report(
        args.output, started, load_start, args, drain_jobs_per_s=drain, rate=rate,
        capacity_jobs_per_s=capacity, capacity_steps=steps, window=window, rows=rows,
        prunes=prunes, verdict=compared, autovacuum=autovacuum,
        server="own" if pg else server, settings=settings, autovacuum_log=autovacuum_log,
    )  # fmt: skip


if __name__ == "__main__":
    main()
