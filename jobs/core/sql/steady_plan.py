"""The claim's plan, whatever jobs_job's statistics say: an ordered walk of jobs_job_pick_idx.

Owns: how PostgreSQL's claim statement is sent so that the planner cannot choose a bitmap scan.
Never: changes the statement, its fence or its result -- only the plan it runs with.

Why: the claim picks `LIMIT n` rows in claim order (priority, run_at, id), which the partial
jobs_job_pick_idx gives in order: a few index entries read, however long the queue. When the
table's statistics say that almost no row is queued -- a table never analyzed (a new deployment,
a restored dump, a server run with autovacuum off, as this project's shared test server is), or
analyzed while the queue was empty -- the planner estimates a handful of rows and prefers a
bitmap scan of the whole partial index, a heap fetch of every queued row and a sort of them all,
to take n. That is O(queue) per claim: measured on a table never analyzed, a claim of 8 from
20,000 queued jobs took 9-13 ms instead of about 1, and a drain ran at 1,478 us per job
(docs/benchmarks.md, 2026-12-02 afternoon). A backlog then makes every claim slower, which grows
the backlog. A prepared claim keeps such a plan until the next ANALYZE.

How: `enable_bitmapscan = off` for the claim's own transaction only (`SET LOCAL`), so the plan --
a custom one, or the generic plan a prepared statement caches (re-planned after an ANALYZE, under
the same setting, because every execution carries it) -- can only walk an index in order or scan
the table (the planner's cost of a full scan and sort against an index walk of LIMIT n rows
keeps the walk). Nothing else on the connection sees the setting:

- autocommit (the drain's claims): BEGIN, SET LOCAL, the claim and COMMIT are sent together in
  one psycopg pipeline -- one round trip, as before -- or, on a client-side binding cursor (no
  prepared statements, JOBS_PREPARED_STATEMENTS=0), as one simple query whose statements run as
  one implicit transaction;
- the claim's own transaction (a limited queue's: its control rows are locked first): SET LOCAL
  first, in that transaction;
- a caller's transaction (not the claim's own: tests inside TestCase): nothing is set -- the
  setting would outlive the claim in the caller's transaction -- and the planner decides.

An error inside the pipeline leaves the transaction aborted (the server skips the COMMIT); it is
rolled back here before the error is raised, as a Django error when `cur` is Django's cursor.
"""

from __future__ import annotations

import contextlib
from typing import Any

from psycopg import ClientCursor, Pipeline
from psycopg.pq import TransactionStatus

GUARD = "SET LOCAL enable_bitmapscan = off"


def execute(cur: Any, sql: str, params: Any, *, own_transaction: bool = False) -> list[Any]:
    """Run the claim `sql` on `cur` (Django's cursor or a psycopg one) with the steady plan and
    return its rows. `own_transaction`: a transaction is open and it is the claim's own."""
    inner = getattr(cur, "cursor", cur)  # Django's CursorWrapper wraps a psycopg cursor
    raw = inner.connection
    status = raw.info.transaction_status
    if status == TransactionStatus.INTRANS:
        if own_transaction:
            cur.execute(GUARD)
        cur.execute(sql, params)
        return cur.fetchall()  # type: ignore[no-any-return]
    if status != TransactionStatus.IDLE or not raw.autocommit:
        cur.execute(sql, params)  # not autocommit, or failed: let the driver say what is wrong
        return cur.fetchall()  # type: ignore[no-any-return]
    if isinstance(inner, ClientCursor):
        cur.execute(f"{GUARD}; {sql}", params)
        cur.nextset()
        return cur.fetchall()  # type: ignore[no-any-return]
    if not Pipeline.is_supported():  # libpq older than 14: the planner decides
        cur.execute(sql, params)
        return cur.fetchall()  # type: ignore[no-any-return]
    errors = getattr(getattr(cur, "db", None), "wrap_database_errors", contextlib.nullcontext())
    try:
        with errors, raw.pipeline():
            raw.execute("BEGIN")
            raw.execute(GUARD)
            cur.execute(sql, params)
            raw.execute("COMMIT")
    except BaseException:
        _abandon(raw)
        raise
    return cur.fetchall()  # type: ignore[no-any-return]


def _abandon(raw: Any) -> None:
    """Roll back what the pipeline left open (the server skips the rest after an error)."""
    if raw.closed or raw.info.transaction_status == TransactionStatus.IDLE:
        return
    with contextlib.suppress(Exception):  # a broken connection: Django discards it
        raw.execute("ROLLBACK")
