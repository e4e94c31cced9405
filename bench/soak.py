#!/usr/bin/env python
"""Sustained load without decay: a steady stream of no-op jobs for a long time, with retention.

    .venv/bin/python bench/soak.py [--minutes 30] [--rate JOBS_PER_S] [--workers 2]
        [--warmup-minutes 6] [--retention-minutes 5] [--prune-every 60] [--interval 60]
        [--vacuum-every 0]

Hours long (on a quiet machine): `bench/soak.py --minutes 480 --warmup-minutes 10`.

What it runs, on a database of its own (palisade_bench_soak, or BENCH_SOAK_DB):

1. The drain: `--measure-jobs` demo.noop jobs inserted, then `manage.py qcluster` (`--workers`
   workers, claim batch 8) started; drain = N / (last finish - first claim), database clock.
   Skipped with `--rate`.
2. The stream: the same qcluster keeps running while a thread enqueues demo.noop jobs at `--rate`
   (default 70 % of the drain just measured), open loop: every 100 ms it inserts the jobs due by
   then, each with its `enqueued` event (the rows `jobs.enqueue()` writes), in one statement.
3. Retention, as docs/operations.md says to run it: `manage.py jobs prune --older-than-days D`
   every `--prune-every` seconds (start to start, in a thread of its own, like cron; one that
   outlasts the period is followed by the next at once), D = `--retention-minutes` / 1440.
4. Every `--interval` seconds (a "minute") it records, after `--warmup-minutes` of the stream:
   - claim p50 / p99: Palisade's own claim statement (jobs.core.sql.PostgresDriver, batch 8)
     timed on a side connection every 0.25 s, inside a transaction that is rolled back (it claims
     nothing for good; each probe leaves a few dead tuples, negligible beside the stream);
   - enqueued/s and drained/s (jobs whose finished_at falls in the minute) and the backlog
     (queued jobs due);
   - per job table (jobs_job, jobs_attempt, jobs_jobevent, and django-q2's broker tables):
     live and dead tuples, heap size, indexes size (pg_stat_user_tables, pg_relation_size,
     pg_indexes_size), each index's size, and autovacuum / autoanalyze runs in the minute.
   Where the server runs with autovacuum off (this machine's PostgreSQL does: a CI setting),
   it says so; `--vacuum-every S` then runs VACUUM (ANALYZE) of the job tables every S seconds in
   its stead (its runs are the `vacuum_runs` figures).
5. The verdict: the mean of the last `--window` minutes (default 5, at most half the run) over
   the mean of the first `--window`, for every figure; the target is within 20 %.

Prints a table per minute and the verdict, and writes every raw number to bench/results/.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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
INDEX_SIZES = """
SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
 WHERE relname = ANY(%s)
"""


class Stream(threading.Thread):
    """Open-loop enqueuer: inserts the jobs due by now every tick, never catching up a burst."""

    def __init__(self, dsn: str, rate: float, tick: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate, self.tick = dsn, rate, tick
        self.sent = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                started = time.monotonic()
                while not self.stopping.wait(self.tick):
                    due = int(self.rate * (time.monotonic() - started)) - self.sent
                    # After a stall, at most five ticks' worth at once: a stream, not a flood.
                    n = min(due, max(1, int(self.rate * self.tick * 5)))
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


class Pruner(threading.Thread):
    """Retention as cron would run it: `manage.py jobs prune` every `every` seconds (start to
    start); a prune that outlasts the period is followed by the next one at once, never two."""

    def __init__(self, env: dict[str, str], days: float, every: float) -> None:
        super().__init__(daemon=True)
        self.env, self.days, self.every = env, days, every
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
                     f"--older-than-days={self.days!r}"],
                    cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=3600,
                )  # fmt: skip
                if out.returncode != 0:
                    raise RuntimeError(f"prune failed: {out.stderr[-2000:]}")
                self.runs.append(
                    {"seconds": round(time.monotonic() - began, 2), "said": out.stdout.strip()}
                )
        except BaseException as exc:  # noqa: BLE001 -- the main loop reports it and stops
            self.error = exc

    def last_seconds(self) -> float:
        return self.runs[-1]["seconds"] if self.runs else 0.0


def minute(
    conn: psycopg.Connection[Any], probe: ClaimProbe, stream: Stream, last: dict[str, Any]
) -> dict[str, Any]:
    """One row of the report: the figures since the previous row (`last`, updated in place)."""
    db_now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    drained = conn.execute(
        "SELECT count(*) FROM jobs_job WHERE finished_at >= %s AND finished_at < %s",
        [last["db_now"], db_now],
    ).fetchone()[0]
    backlog = conn.execute(
        "SELECT count(*) FROM jobs_job WHERE state = 'queued' AND run_at <= clock_timestamp()"
    ).fetchone()[0]
    seconds = (db_now - last["db_now"]).total_seconds()
    claims = probe.take()
    figures = table_figures(conn)
    row = {
        "at": db_now.isoformat(),
        "seconds": round(seconds, 2),
        "enqueued_per_s": (stream.sent - last["sent"]) / seconds,
        "drained_per_s": drained / seconds,
        "backlog": backlog,
        "claim_ms": {
            "p50": percentile(claims, 0.5),
            "p99": percentile(claims, 0.99),
            "n": len(claims),
        },
        **figures,
    }
    for name, t in figures["tables"].items():
        before = last["tables"].get(name, t)
        t["autovacuum_runs"] = t["autovacuum_count"] - before["autovacuum_count"]
        t["autoanalyze_runs"] = t["autoanalyze_count"] - before["autoanalyze_count"]
        t["vacuum_runs"] = t["vacuum_count"] - before["vacuum_count"]
    last.update(db_now=db_now, sent=stream.sent, tables=figures["tables"])
    return row


def flat(row: dict[str, Any]) -> dict[str, float]:
    """Every figure of a row under one name, for the first/last comparison."""
    out = {
        "claim p50 ms": row["claim_ms"]["p50"],
        "claim p99 ms": row["claim_ms"]["p99"],
        "drained/s": row["drained_per_s"],
        "backlog": row["backlog"],
    }
    for name, t in sorted(row["tables"].items()):
        for key in ("dead", "heap_bytes", "indexes_bytes", "autovacuum_runs", "vacuum_runs"):
            out[f"{name} {key}"] = t[key]
    for name, size in sorted(row["indexes"].items()):
        out[f"index {name} bytes"] = size
    return out


def verdict(rows: list[dict[str, Any]], window: int) -> list[dict[str, Any]]:
    firsts, lasts = [flat(r) for r in rows[:window]], [flat(r) for r in rows[-window:]]
    out = []
    for name in firsts[0]:
        a = sum(f[name] for f in firsts) / len(firsts)
        b = sum(f[name] for f in lasts) / len(lasts)
        ratio = b / a if a else (1.0 if b == 0 else float("inf"))
        out.append({"figure": name, "first": a, "last": b, "ratio": ratio,
                    "within": abs(ratio - 1) <= TOLERANCE})  # fmt: skip
    return out


def mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def print_rows(rows: list[dict[str, Any]], first: int = 1) -> None:
    if first == 1:
        head = "row  enq/s drain/s backlog claim p50/p99 ms"
        for t in ("jobs_job", "jobs_attempt", "jobs_jobevent"):
            head += f" | {t[5:]:>11} heapMB idxMB av/v"
        print(head + "   (dead tuples, sizes, autovacuum / VACUUM runs)")
    for i, r in enumerate(rows, first):
        line = (
            f"{i:3d} {r['enqueued_per_s']:6.0f} {r['drained_per_s']:7.0f} {r['backlog']:7d}"
            f" {r['claim_ms']['p50']:6.2f}/{r['claim_ms']['p99']:6.2f}"
        )
        for name in ("jobs_job", "jobs_attempt", "jobs_jobevent"):
            t = r["tables"].get(name, {})
            line += (
                f" | {t.get('dead', 0):>11d} {mb(t.get('heap_bytes', 0)):>6}"
                f" {mb(t.get('indexes_bytes', 0)):>5}"
                f" {t.get('autovacuum_runs', 0):2d}/{t.get('vacuum_runs', 0):d}"
            )
        print(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="measured minutes (after warm-up)")
    p.add_argument("--warmup-minutes", type=float, default=6.0, help="stream before measuring")
    p.add_argument("--rate", type=float, default=None, help="jobs/s (default: 70%% of the drain)")
    p.add_argument("--load", type=float, default=0.7, help="fraction of the measured drain")
    p.add_argument("--measure-jobs", type=int, default=4000, help="jobs for the first drain")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--retention-minutes", type=float, default=5.0, help="prune's cut-off")
    p.add_argument("--prune-every", type=float, default=60.0, help="seconds between prunes")
    p.add_argument("--interval", type=float, default=60.0, help="seconds per report row")
    p.add_argument(
        "--vacuum-every", type=float, default=0.0,
        help="seconds between VACUUMs of the job tables (0: leave it to autovacuum)",
    )  # fmt: skip
    p.add_argument("--window", type=int, default=5, help="rows compared, first and last")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "soak.json")
    args = p.parse_args()
    rows_wanted = int(args.minutes * 60 // args.interval)
    if args.rate is not None and args.rate <= 0 or rows_wanted < 2 or args.prune_every <= 0:
        p.error("--rate must be positive, --minutes at least two --interval, --prune-every > 0")
    if args.retention_minutes * 60 < args.interval:
        p.error("--retention-minutes must cover one --interval (drained jobs are counted late)")
    window = max(1, min(args.window, rows_wanted // 2))
    started, load_start = datetime.now(UTC), uptime()
    print(f"machine: {load_start}")
    env = palisade_database(args.server, DB, JOBS_WORKERS=str(args.workers))
    dsn = f"{args.server}/{DB}"
    conn = psycopg.connect(dsn, autocommit=True)
    autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
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
    try:
        drain = None
        if args.rate is None:
            drain = measure_drain(conn, args.measure_jobs, [cluster])
            print(f"drain: {drain:.0f} jobs/s ({args.measure_jobs} jobs, {args.workers} workers)")
        rate = args.rate if args.rate is not None else drain * args.load  # type: ignore[operator]
        print(f"stream: {rate:.0f} jobs/s; warm-up {args.warmup_minutes:g} min, "
              f"then {rows_wanted} rows of {args.interval:g} s")  # fmt: skip
        stream, probe = Stream(dsn, rate), ClaimProbe(dsn)
        pruner = Pruner(env, args.retention_minutes / 1440, args.prune_every)
        vacuumer = Vacuumer(dsn, args.vacuum_every) if args.vacuum_every else None
        for thread in (stream, probe, pruner, vacuumer):
            if thread is not None:
                thread.start()
        measuring_at = time.monotonic() + args.warmup_minutes * 60
        last: dict[str, Any] = {}
        rows: list[dict[str, Any]] = []
        while len(rows) < rows_wanted:
            failed = stream.error or probe.error or pruner.error or (vacuumer and vacuumer.error)
            if failed or cluster.poll() is not None:
                raise RuntimeError(f"stopped: {failed or 'qcluster exited'}")
            if time.monotonic() < measuring_at:
                time.sleep(min(0.2, measuring_at - time.monotonic()))
                continue
            if not last:
                probe.take()
                last = {
                    "db_now": conn.execute("SELECT clock_timestamp()").fetchone()[0],
                    "sent": stream.sent,
                    "tables": table_figures(conn)["tables"],
                }
            else:
                rows.append(minute(conn, probe, stream, last))
                print_rows(rows[-1:], first=len(rows))
            measuring_at = max(measuring_at + args.interval, time.monotonic() + 1)
    finally:
        for thread in (stream, probe, pruner, vacuumer):
            if thread is not None:
                thread.stopping.set()
        for thread in (stream, probe, pruner, vacuumer):
            if thread is not None:
                thread.join(timeout=120)
        stop(cluster)
        stop_all()
    prunes = pruner.runs if pruner is not None else []
    compared = verdict(rows, window)
    print(f"\nlast {window} rows over first {window} (target: within {TOLERANCE:.0%}):")
    for c in compared:
        mark = "ok " if c["within"] else "OUT"
        scale, unit = (2**20, " MB") if c["figure"].endswith("bytes") else (1, "")
        print(f"  {mark} {c['figure'].removesuffix(' bytes'):<48} {c['first'] / scale:>12.2f}"
              f" -> {c['last'] / scale:>12.2f}{unit}  x{c['ratio']:.2f}")  # fmt: skip
    print(f"prunes: {len(prunes)}, last: {prunes[-1]['said'] if prunes else 'none'}")
    print(f"machine: {uptime()}")
    write_report(
        args.output, started, load_start, args, drain_jobs_per_s=drain, rate=rate,
        window=window, rows=rows, prunes=prunes, verdict=compared, autovacuum=autovacuum,
    )  # fmt: skip


if __name__ == "__main__":
    main()
