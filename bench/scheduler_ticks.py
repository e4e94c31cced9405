#!/usr/bin/env python
"""The embedded scheduler under a stream of enqueues: how often it ticks, what its due count
costs, and how much of jobs_job it reads for that.

    .venv/bin/python bench/scheduler_ticks.py [--finished 500000] [--rate 500] [--seconds 20]
                                              [--rounds 2]

On a database of its own (palisade_bench_ticks, or BENCH_TICKS_DB): `--finished` jobs inserted
queued, ANALYZEd, then all marked succeeded and the table vacuumed without ANALYZE (the
statistics of a backlog on a table that has since run it: what the scheduler meets after a
burst, until autovacuum analyzes again; autovacuum is off for the table meanwhile). Then, per
phase, the real `EmbeddedScheduler.run` (jobs.worker.scheduler, with its maintenance thread)
in a thread of this process while another connection commits `--rate` single-row enqueues a
second for `--seconds` (no workers: the scheduler only requests drains). Two variants,
alternated each round:

  now     as shipped: the due count is jobs_count_due (migration 0021), ticks woken by enqueues
          at least TICK_SPACING_SECONDS apart
  before  the inline due count (jobs.core.sql.base.Driver.count_due) and no spacing: the
          scheduler before 2026-12-05 evening

Prints per variant: ticks a second, the due count's p50 / p99 and its seconds per minute, and
the rows of jobs_job read by sequential scans a second (pg_stat_user_tables.seq_tup_read).
The enqueued jobs are marked succeeded after each phase, and the table vacuumed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import uptime  # noqa: E402
from bench.systems import palisade_database  # noqa: E402

DB = os.environ.get("BENCH_TICKS_DB", "palisade_bench_ticks")


def seq_rows(conn: Any) -> int:
    row = conn.execute(
        "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relname = 'jobs_job'"
    ).fetchone()
    return int(row[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--finished", type=int, default=500_000)
    p.add_argument("--rate", type=int, default=500, help="enqueues a second")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    args = p.parse_args()
    print(f"machine: {uptime()}")
    palisade_database(args.server, DB, JOBS_LOG_LEVEL="WARNING")
    import psycopg
    from django.db import connection

    from jobs.core import transitions
    from jobs.core.sql.base import Driver
    from jobs.core.sql.postgres import PostgresDriver
    from jobs.worker import scheduler

    dsn = f"{args.server.rstrip('/')}/{DB}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO jobs_job (kind) SELECT 'demo.noop' FROM generate_series(1, %s)",
            [args.finished],
        )
        admin.execute("ANALYZE jobs_job")
        admin.execute(
            "UPDATE jobs_job SET state = 'succeeded', attempt = 1, finished_at = clock_timestamp()"
        )
        admin.execute("ALTER TABLE jobs_job SET (autovacuum_enabled = false)")  # stats stay
        admin.execute("VACUUM jobs_job")  # as autovacuum would: no dead head in the pick index

    shipped_count, shipped_spacing = PostgresDriver.count_due, scheduler.TICK_SPACING_SECONDS
    real_count, real_tick = transitions.count_due, scheduler.EmbeddedScheduler.tick

    def phase(variant: str) -> dict[str, float]:
        if variant == "before":
            PostgresDriver.count_due = Driver.count_due  # type: ignore[method-assign]
            scheduler.TICK_SPACING_SECONDS = 0.0
        else:
            PostgresDriver.count_due = shipped_count  # type: ignore[method-assign]
            scheduler.TICK_SPACING_SECONDS = shipped_spacing
        ticks: list[float] = []
        counts: list[float] = []

        def timed_count(*a: Any, **k: Any) -> int:
            t0 = time.perf_counter()
            try:
                return real_count(*a, **k)
            finally:
                counts.append(time.perf_counter() - t0)

        def counted_tick(self: Any) -> None:
            ticks.append(time.monotonic())
            real_tick(self)

        scheduler.transitions.count_due = timed_count  # type: ignore[attr-defined]
        scheduler.EmbeddedScheduler.tick = counted_tick  # type: ignore[method-assign]
        with psycopg.connect(dsn, autocommit=True) as conn:
            seq0 = seq_rows(conn)
            done = threading.Event()
            sched = scheduler.EmbeddedScheduler()
            thread = threading.Thread(target=sched.run, args=(done.is_set,), daemon=True)
            thread.start()
            start = time.monotonic()
            sent = 0
            while (now := time.monotonic()) < start + args.seconds:
                due = start + sent / args.rate
                if now < due:
                    time.sleep(due - now)  # the stream's pace, not a wait for a condition
                conn.execute("INSERT INTO jobs_job (kind) VALUES ('demo.noop')")
                sent += 1
            elapsed = time.monotonic() - start
            done.set()
            thread.join(30)
            time.sleep(1.1)  # a backend flushes its pg_stat counters at most once a second
            seq1 = seq_rows(conn)
            conn.execute(
                "UPDATE jobs_job SET state = 'succeeded', attempt = 1, "
                "finished_at = clock_timestamp() WHERE state = 'queued'"
            )
            conn.execute("VACUUM jobs_job")
            conn.execute("DELETE FROM django_q_ormq")
        scheduler.transitions.count_due = real_count  # type: ignore[attr-defined]
        scheduler.EmbeddedScheduler.tick = real_tick  # type: ignore[method-assign]
        connection.close()
        ms = sorted(c * 1000 for c in counts) or [0.0]
        return {
            "enqueues_per_s": sent / elapsed,
            "ticks_per_s": len(ticks) / elapsed,
            "count_p50_ms": statistics.median(ms),
            "count_p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            "count_s_per_min": sum(counts) / elapsed * 60,
            "seq_rows_per_s": (seq1 - seq0) / elapsed,
        }

    results: dict[str, list[dict[str, float]]] = {"now": [], "before": []}
    for r in range(args.rounds):
        for variant in ("now", "before") if r % 2 == 0 else ("before", "now"):
            row = phase(variant)
            results[variant].append(row)
            print(f"[{r + 1}/{args.rounds}] {variant}: " + ", ".join(
                f"{k} {v:,.1f}" for k, v in row.items()), flush=True)  # fmt: skip
    print(f"\n{args.finished:,} finished jobs ahead, {args.rate}/s enqueued, medians of "
          f"{args.rounds}")  # fmt: skip
    keys = list(results["now"][0])
    print(f"{'variant':<8}" + "".join(f"{k:>18}" for k in keys))
    for variant, rows in results.items():
        print(f"{variant:<8}" + "".join(
            f"{statistics.median(r[k] for r in rows):>18,.1f}" for k in keys))  # fmt: skip
    print(f"machine: {uptime()}")


if __name__ == "__main__":
    main()
