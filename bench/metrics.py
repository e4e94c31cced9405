#!/usr/bin/env python
"""What a /metrics scrape costs with a million jobs.

    .venv/bin/python bench/metrics.py [--rows 1000000] [--queued 100000] [--samples 20]

Against a fresh database `palisade_ops_bench_metrics` (dropped, recreated, migrated): --rows
finished jobs (one attempt with a heartbeat gap, claimed + succeeded events each), --queued
queued jobs over three queues, 50 running jobs (5 with an expired lease), 1,000 rejected
commits; VACUUM ANALYZE. Then, in-process (jobs.ops.metrics.render, no HTTP):

  cold     the first scrape of a process: the whole event history is tallied once
  warm     --samples scrapes after it (only rows newer than the settled id are re-read)
  burst    20,000 new events (10,000 claims + commits), then one scrape -- three times
  after    --samples scrapes after that
  explain  EXPLAIN ANALYZE of the queue-depth statement

Prints a table and writes bench/results/metrics-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

# A measurement never reads a developer's .env (bin/setup --dev): DEBUG there logs every query.
os.environ.setdefault("PALISADE_ENV_FILE", "none")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SERVER = "postgres://postgres@127.0.0.1:5432"
DB_NAME = "palisade_ops_bench_metrics"
DB_URL = f"{SERVER}/{DB_NAME}"
RESULTS = ROOT / "bench" / "results"

SEED = [
    """
    INSERT INTO jobs_job (kind, payload, queue, priority, state, attempt, run_at, created_at,
                          updated_at, finished_at, result, result_ref, error)
    SELECT (ARRAY['demo.noop','demo.sleep','mail.send'])[1 + i %% 3], '{}',
           (ARRAY['default','mail','reports'])[1 + i %% 3], 0,
           CASE WHEN i %% 97 = 0 THEN 'failed' ELSE 'succeeded' END, 1, t, t,
           t + interval '1 second', t + interval '1 second', '{}', '', ''
      FROM (SELECT i, now() - make_interval(secs => (%(n)s - i) * 0.05) AS t
              FROM generate_series(1, %(n)s) i) s
    """,
    """
    INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, heartbeat_at, ended_at,
                              outcome, staging_ref, error, heartbeat_gap_max)
    SELECT id, 1, 'bench:' || (id %% 4), created_at, created_at, finished_at, state, '', '',
           (id %% 50) / 10.0
      FROM jobs_job
    """,
    """
    INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
    SELECT id, 1, e.type, 'bench', CASE e.type WHEN 'claimed' THEN created_at
           ELSE finished_at END, '{}'
      FROM jobs_job, (VALUES ('claimed'), ('succeeded')) AS e(type) ORDER BY id
    """,
    """
    INSERT INTO jobs_job (kind, payload, queue, state, run_at)
    SELECT 'demo.noop', '{}', (ARRAY['default','mail','reports'])[1 + i %% 3], 'queued',
           now() - make_interval(secs => i %% 600)
      FROM generate_series(1, %(queued)s) i
    """,
    """
    INSERT INTO jobs_job (kind, payload, state, attempt, lease_expires_at)
    SELECT 'demo.sleep', '{}', 'running', 1,
           now() + make_interval(secs => CASE WHEN i <= 5 THEN -60 ELSE 600 END)
      FROM generate_series(1, 50) i
    """,
    """
    INSERT INTO jobs_rejectedwrite (job_id, attempt_presented, attempt_current, state_current,
                                    worker, write, at)
    SELECT id, 1, 2, 'succeeded', 'zombie', 'commit', finished_at FROM jobs_job
     WHERE state = 'succeeded' ORDER BY id LIMIT 1000
    """,
]
BURST = """
WITH picked AS (SELECT id FROM jobs_job WHERE state = 'queued' ORDER BY id LIMIT 10000)
INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
SELECT id, 1, e.type, 'burst', clock_timestamp(), '{}'
  FROM picked, (VALUES ('claimed'), ('succeeded')) AS e(type)
"""


def log(message: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {message}", flush=True)


def prepare(rows: int, queued: int) -> None:
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB_NAME}")
    env = {**os.environ, "DATABASE_URL": DB_URL, "DJANGO_SETTINGS_MODULE": "config.settings"}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    with psycopg.connect(DB_URL, autocommit=True) as conn:
        for statement in SEED:
            conn.execute(statement, {"n": rows, "queued": queued})
        for table in ("jobs_job", "jobs_attempt", "jobs_jobevent", "jobs_rejectedwrite"):
            conn.execute(f"VACUUM ANALYZE {table}")


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    log(f"seeding {args.rows:,} finished + {args.queued:,} queued jobs")
    prepare(args.rows, args.queued)
    os.environ.update({"DATABASE_URL": DB_URL, "DJANGO_SETTINGS_MODULE": "config.settings"})
    import django

    django.setup()
    from django.db import connection

    from jobs.ops import metrics

    cold = timed(metrics.render)
    log(f"cold scrape {cold:.0f} ms")
    warm = [timed(metrics.render) for _ in range(args.samples)]
    burst = []  # the first scrape after 20,000 new events reads them; the next ones do not
    for _ in range(3):
        with psycopg.connect(DB_URL, autocommit=True) as conn:
            conn.execute(BURST)
        burst.append(timed(metrics.render))
    after = [timed(metrics.render) for _ in range(args.samples)]
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + _queue_sql())
        plan = "\n".join(r[0] for r in cur.fetchall())
    sample = metrics.render().decode()

    def stats(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {
            "p50": statistics.median(ordered),
            "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "max": ordered[-1],
        }

    result = {
        "rows": args.rows,
        "queued": args.queued,
        "cold_ms": cold,
        "warm_ms": stats(warm),
        "first_after_20k_events_ms": burst,
        "after_burst_ms": stats(after),
        "queue_plan": plan,
    }
    print(f"\ncold scrape: {cold:.0f} ms")
    print("first scrape after 20,000 new events: " + ", ".join(f"{b:.0f} ms" for b in burst))
    for name in ("warm_ms", "after_burst_ms"):
        s = result[name]
        print(f"{name}: p50 {s['p50']:.1f} ms, p95 {s['p95']:.1f} ms, max {s['max']:.1f} ms")  # type: ignore[index]
    print("\nqueue statement:\n" + plan)
    print("\n" + "\n".join(line for line in sample.splitlines() if not line.startswith("#"))[:3000])
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"metrics-{stamp}.json").write_text(json.dumps(result, indent=2))
    return 0


def _queue_sql() -> str:
    from django.db import connection

    from jobs.core.sql import driver_for

    driver = driver_for(connection.vendor)
    oldest = f"MIN(CASE WHEN run_at <= {driver.now} THEN run_at END)"
    return (
        f"SELECT queue, COUNT(*), {driver.seconds_between(driver.now, oldest)} "
        "FROM jobs_job WHERE state = 'queued' GROUP BY queue"
    )


if __name__ == "__main__":
    raise SystemExit(main())
