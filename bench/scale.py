#!/usr/bin/env python
"""Scale curves: claim latency and drain rate with 10k, 100k and 1M jobs already in the table,
and what each job leaves behind (bytes per million jobs in jobs_job, jobs_attempt, jobs_jobevent).

    .venv/bin/python bench/scale.py [--sizes 10000,100000,1000000] [--jobs 4000] [--repeat 2]

For each size the table is grown (by SQL, in one database) to that many history rows: finished
jobs (every 97th failed) with one attempt and two events each (claimed, succeeded: what a real
no-op leaves), plus 1% queued jobs not yet due (run_at tomorrow: retries waiting). Then, with N
due demo.noop jobs on top, alternating `--repeat` times:

  claim     2 raw processes running Palisade's own claim (batch 8) and batch commit statements
            (jobs.core.sql.PostgresDriver): every claim statement timed; p50 / p99 / max in ms.
  drain     `manage.py qcluster` (2 workers, batch 8) draining the N jobs: N / (last finish -
            first claim), database clock.

Footprint: the drained jobs' own rows (pg_total_relation_size growth per job, indexes included,
measured on the first size) scaled to a million jobs. Database: palisade_bench_scale.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    spawn,
    stop,
    stop_all,
    summarize,
    uptime,
    wait_for,
)
from bench.systems import palisade_database, write_report  # noqa: E402
from bench.systems.palisade import race  # noqa: E402

DB = "palisade_bench_scale"
TABLES = ("jobs_job", "jobs_attempt", "jobs_jobevent")

GROW = """
INSERT INTO jobs_job (kind, payload, queue, priority, state, attempt, run_at, created_at,
                      updated_at, finished_at, unique_key, result, result_ref, error)
SELECT 'demo.noop', jsonb_build_object('order', i), 'default', 0,
       CASE WHEN i %% 97 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
       t, t, t + interval '1 second', t + interval '1 second', NULL, 'null', '', ''
  FROM (SELECT i, now() - make_interval(secs => (%(hi)s - i) * 0.05) AS t
          FROM generate_series(%(lo)s::int, %(hi)s::int) AS i) s
"""
GROW_WAITING = """
INSERT INTO jobs_job (kind, payload, queue, priority, state, attempt, run_at, unique_key,
                      result_ref, error)
SELECT 'demo.noop', '{}', 'default', 0, 'queued', 0, now() + interval '1 day', NULL, '', ''
  FROM generate_series(1, %(n)s::int)
"""
GROW_ATTEMPTS = """
INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, heartbeat_at, ended_at, outcome,
                          staging_ref, error)
SELECT id, 1, 'bench-host:' || (id %% 4), created_at, created_at, finished_at, state, '', ''
  FROM jobs_job WHERE id > %(after)s AND finished_at IS NOT NULL
"""
GROW_EVENTS = """
INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
SELECT id, 1, e.type, 'bench-host:' || (id %% 4),
       CASE e.type WHEN 'claimed' THEN created_at ELSE finished_at END, '{}'
  FROM jobs_job, (VALUES ('claimed'), ('succeeded')) AS e(type)
 WHERE id > %(after)s AND finished_at IS NOT NULL
"""


def claim_worker(dsn: str, batch: int, ready: Any, go: Any, results: Any) -> None:
    """Palisade's claim + batch commit on a raw connection; every claim statement timed."""
    os.environ["JOBS_CLAIM_BATCH"] = str(batch)
    import django

    django.setup()
    from jobs.core.sql import CommitRow, PostgresDriver

    driver = PostgresDriver()
    worker = f"bench-scale:{os.getpid()}"
    timings: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        ready.put(os.getpid())
        go.wait()
        while True:
            t0 = time.perf_counter()
            rows = driver.claim(cur, worker, batch, 30.0, None, {})
            timings.append((time.perf_counter() - t0) * 1000)
            if not rows:
                break
            driver.commit(cur, worker, [CommitRow(r.id, r.attempt, None, "") for r in rows])
    results.put(timings)


class Scale:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = args.server.rstrip("/")
        self.dsn = f"{self.server}/{DB}"
        self.env = palisade_database(self.server, DB, JOBS_WORKERS=str(args.workers))
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.history = 0
        self.last_before = 0

    def one(self, query: str, params: Any = None) -> tuple[Any, ...]:
        row = self.conn.execute(query, params).fetchone()
        assert row is not None
        return tuple(row)

    def grow(self, size: int) -> float:
        t0 = time.monotonic()
        after = self.one("SELECT coalesce(max(id), 0) FROM jobs_job")[0]
        lo, hi = self.history + 1, size
        self.conn.execute(GROW, {"lo": lo, "hi": hi})
        self.conn.execute(GROW_WAITING, {"n": (hi - lo + 1) // 100})
        self.conn.execute(GROW_ATTEMPTS, {"after": after})
        self.conn.execute(GROW_EVENTS, {"after": after})
        for table in TABLES:
            self.conn.execute(f"VACUUM ANALYZE {table}")
        self.history = size
        return time.monotonic() - t0

    def sizes(self) -> dict[str, int]:
        return {t: self.one("SELECT pg_total_relation_size(%s)", (t,))[0] for t in TABLES}

    def add_due(self) -> int:
        """N due jobs on top of the history; returns the id before them."""
        from jobs.models import Job

        before = self.one("SELECT coalesce(max(id), 0) FROM jobs_job")[0]
        Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(self.args.jobs)])
        self.conn.execute("ANALYZE jobs_job")
        self.conn.execute("CHECKPOINT")
        return int(before)

    def claim_latency(self) -> dict[str, Any]:
        self.add_due()
        timings = race(claim_worker, (self.dsn, 8), self.args.workers, self.args.timeout)
        return summarize([t for per in timings for t in per])

    def drain(self) -> dict[str, Any]:
        before = self.last_before = self.add_due()
        n = self.args.jobs
        log = RESULTS_DIR / "logs" / f"scale-{self.history}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        proc = spawn([sys.executable, "manage.py", "qcluster"], self.env, log)
        try:

            def done() -> bool:
                left = self.one(
                    "SELECT count(*) FROM jobs_job WHERE id > %s AND state <> 'succeeded'",
                    (before,),
                )[0]
                return bool(left == 0)

            wait_for(done, self.args.timeout, "scale drain", [proc], interval=0.02)
            first, last = self.one(
                "SELECT min(a.claimed_at), max(j.finished_at) FROM jobs_job j "
                "JOIN jobs_attempt a ON a.job_id = j.id WHERE j.id > %s",
                (before,),
            )
        finally:
            stop(proc)
        span = (last - first).total_seconds()
        return {"jobs": n, "span_s": round(span, 3), "jobs_per_s": n / span}

    def settle_drained(self) -> None:
        """The drained jobs become history: no longer due, counted in the table's size."""
        for table in TABLES:
            self.conn.execute(f"VACUUM ANALYZE {table}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--jobs", type=int, default=4000, help="due jobs per measurement")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "scale.json")
    args = p.parse_args()
    started = datetime.now(UTC)
    load_start = uptime()
    print(f"machine: {load_start}")
    bench = Scale(args)
    results: list[dict[str, Any]] = []
    footprint: dict[str, Any] = {}
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            took = bench.grow(size)
            print(f"{size:>9,} history rows (grown in {took:.0f} s)", flush=True)
            row: dict[str, Any] = {"history_jobs": size, "claim_ms": [], "drain": []}
            for rep in range(args.repeat):
                sizes_before = bench.sizes()
                jobs_before = bench.one("SELECT count(*) FROM jobs_job")[0]
                drain = bench.drain()
                bench.settle_drained()
                if not footprint:
                    grown = {t: bench.sizes()[t] - sizes_before[t] for t in TABLES}
                    added = bench.one("SELECT count(*) FROM jobs_job")[0] - jobs_before
                    footprint = {
                        "jobs": added,
                        "bytes_per_job": {t: round(v / added, 1) for t, v in grown.items()},
                        "gb_per_million_jobs": {
                            t: round(v / added * 1e6 / 1e9, 3) for t, v in grown.items()
                        },
                        "rows_per_job": {
                            t: bench.one(
                                f"SELECT count(*)::float / %s FROM {t} x JOIN jobs_job j "
                                "ON j.id = x.job_id AND j.id > %s",
                                (added, bench.last_before),
                            )[0]
                            for t in ("jobs_attempt", "jobs_jobevent")
                        },
                    }
                claim = bench.claim_latency()
                bench.settle_drained()
                row["drain"].append(drain)
                row["claim_ms"].append(claim)
                print(
                    f"  [{rep + 1}] drain {drain['jobs_per_s']:.0f} jobs/s; claim p50 "
                    f"{claim['p50']:.2f} ms p99 {claim['p99']:.2f} ms max {claim['max']:.1f}",
                    flush=True,
                )
            results.append(row)
    finally:
        stop_all()
    print(f"footprint: {json.dumps(footprint)}")
    write_report(args.output, started, load_start, args, results=results, footprint=footprint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
