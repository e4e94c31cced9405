#!/usr/bin/env python
"""Where a single `jobs.enqueue()` spends its client's CPU, part by part.

    DATABASE_URL=postgres://.../palisade_bench_x .venv/bin/python bench/enqueue_parts.py \\
        [--n 3000] [--rounds 3]

One process, one autocommit connection, the database migrated by the caller; each part is run
`--n` times in a row, `--rounds` times, and its best round's CPU per call printed (this thread's
CPU: `time.thread_time()`, which other work on a shared machine disturbs far less than the wall
clock):

  jobs.enqueue       the whole call (`demo.noop`, an empty payload), as an application makes it
  rules              jobs.core.enqueue.checked: the arguments' checks, the payload's JSON text
  parameters         the statement's parameters from the checked row (Django's get_db_prep_save)
  django checks      what Django's cursor checks before a statement (health, thread, broken
                     transaction, error wrapping) and whether the statement may be prepared
  execute            jobs.models.one_statement._execute: the prepared statement sent, its row read
  build the Job      the model instance from what was sent and what the database returned
  psycopg execute    the same prepared statement and parameters on a bare psycopg cursor
  floor INSERT       pgbench's floor from this client: a prepared single-row INSERT into a
                     two-column table (a real one, so its commit waits for the WAL flush as
                     the enqueue's does; dropped at the end), on the same connection
  SELECT 1           a prepared `SELECT 1`: a round trip the server answers at once

The enqueued jobs are deleted at the end. Nothing here is a test. Used in docs/benchmarks.md
(2026-12-06, eighth session) to show what part of the single enqueue is Python's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def best_of(rounds: int, n: int, fn: Callable[[], object]) -> tuple[float, list[float]]:
    """CPU microseconds per call of `fn`: the best round's, and every round's."""
    seen = []
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(n):
            fn()
        seen.append(1e6 * (time.thread_time() - started) / n)
    return min(seen), seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="calls per part per round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("PALISADE_ENV_FILE", "none")
    import django

    django.setup()
    import psycopg
    from django.db import connection

    import jobs
    from jobs.core import enqueue as rules
    from jobs.models import Job, one_statement, prepared

    for _ in range(200):  # the statement prepared, the plan and the cursor's types learnt
        jobs.enqueue("demo.noop", {})
    row, payload_json = rules.checked("demo.noop", {})
    plan = one_statement._PLANS[(connection.alias, Job, tuple(row), False)]
    assert plan is not None and plan.lean is not None

    def parameters() -> list[object]:
        params: list[object] = []
        for f in plan.slots:
            value = row[f.attname]
            if f is plan.payload:
                value = payload_json
            elif value is not None:
                value = f.get_db_prep_save(value, connection)
            params.append(value)
        return params

    params = parameters()
    found = one_statement._execute(connection, plan.sql, params)
    assert found is not None
    raw = connection.connection

    def django_checks() -> None:
        connection.close_if_health_check_failed()
        connection.ensure_connection()
        connection.validate_thread_sharing()
        connection.validate_no_broken_transaction()
        with connection.wrap_database_errors:
            prepared.allowed(connection, connection.connection)

    cur = psycopg.Cursor(raw)
    floor = f"bench_floor_{os.getpid()}"
    cur.execute(f"CREATE TABLE {floor} (id bigserial PRIMARY KEY, kind text, payload jsonb)")

    def bare(sql: str, values: list[object], fetch: bool) -> Callable[[], None]:
        def run() -> None:
            cur.execute(sql, values, prepare=True)  # type: ignore[arg-type]
            if fetch:
                cur.fetchone()

        return run

    parts: list[tuple[str, Callable[[], object]]] = [
        ("jobs.enqueue", lambda: jobs.enqueue("demo.noop", {})),
        ("rules", lambda: rules.checked("demo.noop", {})),
        ("parameters", parameters),
        ("django checks", django_checks),
        ("execute", lambda: one_statement._execute(connection, plan.sql, params)),
        ("build the Job", lambda: one_statement._built(Job, connection, plan.lean, row, found)),
    ]
    floor_sql = f"INSERT INTO {floor} (kind, payload) VALUES (%s, %s)"
    threshold = raw.prepare_threshold
    print(f"machine: {os.getloadavg()[0]:.2f} load; {args.rounds} rounds of {args.n} calls")
    print(f"{'part':18s} {'CPU us/call':>11s}  (rounds)")
    try:
        for name, fn in parts:
            best, seen = best_of(args.rounds, args.n, fn)
            print(f"{name:18s} {best:11.1f}  ({', '.join(f'{s:.1f}' for s in seen)})")
        raw.prepare_threshold = 0  # psycopg prepares what is sent with prepare=True
        for name, fn in [
            ("psycopg execute", bare(plan.sql, params, True)),
            ("floor INSERT", bare(floor_sql, ["demo.noop", "{}"], False)),
            ("SELECT 1", bare("SELECT 1", [], True)),
        ]:
            best, seen = best_of(args.rounds, args.n, fn)
            print(f"{name:18s} {best:11.1f}  ({', '.join(f'{s:.1f}' for s in seen)})")
    finally:
        raw.prepare_threshold = threshold
        cur.execute(f"DROP TABLE {floor}")
        cur.close()
        Job.objects.filter(kind="demo.noop", state="queued").delete()


if __name__ == "__main__":
    main()
