#!/usr/bin/env python
"""What a job writes to the WAL: records and bytes per job, by record type and by relation.

    .venv/bin/python bench/wal_per_job.py [--enqueues 5000] [--jobs 20000] [--batch 64]

Why: on this machine a commit's WAL flush is most of a single enqueue's time, and index entries
are most of what a drain writes; this is the ledger behind those sentences (docs/benchmarks.md).
On a database of its own (palisade_bench_wal, or BENCH_WAL_DB), in autocommit, each phase reads
PostgreSQL's WAL between two LSNs with pg_walinspect (PostgreSQL 15's contrib extension,
created in that database):

  floor     N single-row INSERTs into a scratch table (id bigserial, kind text, payload jsonb):
            pgbench's floor, the statement bench/enqueue_single.py times
  enqueue   N `jobs.enqueue("demo.noop", {})`, one call per transaction (the one statement)
  drain     `jobs.worker.runner.drain()` in this process over N no-op jobs inserted beforehand
            (their insert is not counted), claim batch --batch: claims, commits, heartbeats

Per phase: records and bytes per job by resource manager / record type (full-page images
apart: they depend on how recently a checkpoint ran), then by relation (table or index), so a
reader sees which index costs what. The WAL is the whole server's: run it on a quiet server
(autovacuum of another database would be counted; its relations show as "(other)").
Writes bench/results/wal_per_job.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, uptime  # noqa: E402
from bench.systems import palisade_database  # noqa: E402

DB = os.environ.get("BENCH_WAL_DB", "palisade_bench_wal")
SCRATCH = "CREATE TABLE bench_floor (id bigserial PRIMARY KEY, kind text, payload jsonb)"
FLOOR = "INSERT INTO bench_floor (kind, payload) VALUES ('demo.noop', '{}')"

BY_TYPE = """
SELECT resource_manager || '/' || record_type, count(*), sum(record_length), sum(fpi_length)
  FROM pg_get_wal_records_info(%s, %s)
 GROUP BY 1 ORDER BY 3 DESC
"""
# A record's first block names its relation (rel tablespace/database/filenode); a record with
# no block (a commit, a running-transactions snapshot) has none.
BY_RELATION = """
SELECT coalesce(pg_filenode_relation(0, substring(block_ref FROM 'rel \\d+/\\d+/(\\d+)')::oid)
                    ::text,
                CASE WHEN block_ref ~ 'rel ' THEN '(other)' ELSE '(no relation)' END),
       count(*), sum(record_length), sum(fpi_length)
  FROM pg_get_wal_records_info(%s, %s)
 GROUP BY 1 ORDER BY 3 DESC
"""


def measure(cur: Any, n: int, work: Callable[[], None]) -> dict[str, Any]:
    """WAL written while `work` runs, per job (n jobs)."""
    start = cur.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    work()
    end = cur.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    # pg_walinspect reads only flushed WAL, and the last records (a hint, a snapshot) may not
    # be yet: one durable commit after `end` flushes past it (and is not counted).
    cur.execute(FLOOR)

    def rows(sql: str) -> list[dict[str, Any]]:
        return [
            {"name": name, "records": count / n, "bytes": size / n, "fpi_bytes": fpi / n}
            for name, count, size, fpi in cur.execute(sql, (start, end)).fetchall()
        ]

    by_type = rows(BY_TYPE)
    return {
        "jobs": n,
        "records": sum(r["records"] for r in by_type),
        "bytes": sum(r["bytes"] for r in by_type),
        "fpi_bytes": sum(r["fpi_bytes"] for r in by_type),
        "by_type": by_type,
        "by_relation": rows(BY_RELATION),
    }


def show(name: str, found: dict[str, Any], top: int) -> None:
    print(
        f"\n{name}: {found['records']:.1f} records, {found['bytes']:.0f} bytes"
        f" (+{found['fpi_bytes']:.0f} in full-page images) per job"
    )
    for part in ("by_type", "by_relation"):
        print(f"  {'records/job':>11} {'bytes/job':>9}  {part.replace('_', ' ')}")
        for r in found[part][:top]:
            print(f"  {r['records']:11.2f} {r['bytes']:9.0f}  {r['name']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--enqueues", type=int, default=5000, help="floor and enqueue: calls")
    p.add_argument("--jobs", type=int, default=20000, help="drain: jobs")
    p.add_argument("--batch", type=int, default=64, help="drain: JOBS_CLAIM_BATCH")
    p.add_argument("--top", type=int, default=14, help="rows shown per table")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "wal_per_job.json")
    args = p.parse_args()
    if min(args.enqueues, args.jobs, args.batch) < 1:
        p.error("--enqueues, --jobs and --batch must be at least 1")
    started, load = datetime.now(UTC), uptime()
    print(f"machine: {load}")
    palisade_database(args.server, DB, JOBS_CLAIM_BATCH=str(args.batch))
    import psycopg

    from jobs import enqueue
    from jobs.models import Job
    from jobs.worker import runner

    # The readings go through a connection of their own, so they write nothing of their own.
    with psycopg.connect(f"{args.server}/{DB}", autocommit=True) as watch:
        cur = watch.cursor()
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cur.execute(SCRATCH)
        n = args.enqueues
        for _ in range(20):  # warm-up: prepared statements, the backends' caches
            enqueue("demo.noop", {})
            cur.execute(FLOOR)
        found: dict[str, Any] = {}

        def floor() -> None:
            with psycopg.connect(f"{args.server}/{DB}", autocommit=True) as conn:
                for _ in range(n):
                    conn.execute(FLOOR, prepare=True)

        def enqueues() -> None:
            for _ in range(n):
                enqueue("demo.noop", {})

        def drain() -> None:
            while runner.drain():
                pass

        found["floor"] = measure(cur, n, floor)
        found["enqueue"] = measure(cur, n, enqueues)
        drain()  # the enqueue phase's jobs, and the warm-up's
        Job.objects.bulk_create(
            [Job(kind="demo.noop", payload={}) for _ in range(args.jobs)], batch_size=5000
        )
        found["drain"] = measure(cur, args.jobs, drain)
        settings = {}
        for k in ("full_page_writes", "wal_compression", "checkpoint_timeout", "max_wal_size"):
            shown = cur.execute(f"SHOW {k}").fetchone()
            settings[k] = shown[0] if shown else None
    for name, part in found.items():
        show(name, part, args.top)
    print(
        f"\nenqueue / floor: {found['enqueue']['bytes'] / found['floor']['bytes']:.1f}x the"
        f" bytes, {found['enqueue']['records'] / found['floor']['records']:.1f}x the records"
    )
    print(f"server: {settings}\nmachine: {uptime()}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "started": started.isoformat(),
                "load_start": load,
                "args": {k: v for k, v in vars(args).items() if k != "output"},
                "server_settings": settings,
                **found,
            },
            indent=2,
            default=str,
        )
    )
    print(f"results: {args.output}")


if __name__ == "__main__":
    main()
