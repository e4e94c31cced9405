"""Worker processes of the raw loops (spawned by bench/systems/palisade.py)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psycopg

from bench.protocol import ROOT

BARE_CLAIM = """
UPDATE bench_bare_job
   SET state = 'running', attempt = attempt + 1,
       lease_expires_at = clock_timestamp() + interval '30 seconds',
       claimed_at = clock_timestamp()
 WHERE id = (SELECT id FROM bench_bare_job
              WHERE state = 'queued' AND run_at <= clock_timestamp()
              ORDER BY priority DESC, run_at, id
              LIMIT 1
                FOR UPDATE SKIP LOCKED)
RETURNING id, attempt, kind, payload
"""

BARE_COMMIT = """
UPDATE bench_bare_job
   SET state = 'succeeded', result = 'null'::jsonb, lease_expires_at = NULL,
       finished_at = clock_timestamp()
 WHERE id = %s AND attempt = %s AND state = 'running'
"""


def bare_worker(dsn: str, ready: Any, go: Any, results: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ready.put(os.getpid())
        go.wait()
        cpu0 = time.process_time()
        done = rejected = 0
        while True:
            row = conn.execute(BARE_CLAIM).fetchone()
            if row is None:
                break
            if conn.execute(BARE_COMMIT, (row[0], row[1])).rowcount != 1:
                rejected += 1
            done += 1
    results.put((done, rejected, time.process_time() - cpu0))


def _child_django(batch: int) -> None:
    os.environ["JOBS_CLAIM_BATCH"] = str(batch)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def sql_worker(dsn: str, batch: int, ready: Any, go: Any, results: Any) -> None:
    """Palisade's claim and batch-commit statements (jobs.core.sql) on a raw autocommit
    connection."""
    _child_django(batch)
    from jobs.core.sql import CommitRow, PostgresDriver

    driver = PostgresDriver()
    worker = f"bench-sql:{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        ready.put(os.getpid())
        go.wait()
        cpu0 = time.process_time()
        done = 0
        while rows := driver.claim(cur, worker, batch, 30.0, None, {}):
            committed = driver.commit(
                cur, worker, [CommitRow(r.id, r.attempt, None, "") for r in rows]
            )
            if len(committed) != len(rows):
                raise RuntimeError("a fenced commit was rejected in an uncontended loop")
            done += len(rows)
    results.put((done, time.process_time() - cpu0))


def runner_worker(dsn: str, batch: int, ready: Any, go: Any, results: Any) -> None:
    """jobs.runner.drain() in a plain Django process: no django-q2, no embedded scheduler."""
    _child_django(batch)
    from django.db import connection

    from jobs.worker import runner

    connection.ensure_connection()
    ready.put(os.getpid())
    go.wait()
    cpu0 = time.process_time()
    done = 0
    while True:
        ran = runner.drain()
        if not ran:
            break
        done += ran
    results.put((done, time.process_time() - cpu0))
    connection.close()
