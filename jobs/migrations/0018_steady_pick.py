"""The claim's pick as a function planned with sorts and bitmap scans off (jobs_pick).

A claim takes `LIMIT n` queued rows in claim order (priority DESC, run_at, id), which the partial
jobs_job_pick_idx gives in order: a few index entries read however long the queue. Whether the
planner takes that walk depends on jobs_job's statistics: when they say almost nothing is queued
-- a table never analyzed (a new deployment, a restored dump, a server with autovacuum off), or
analyzed while the queue was empty and then given a burst -- it estimates one row, and one row
costs nothing to sort, so any index that holds the queued rows will do: a bitmap scan of
jobs_job_pick_idx, or jobs_job_queue_depth_idx in its own order, then a sort of every queued row
to take n. Measured: a claim of 8 from 20,000 queued jobs 9-13 ms on a table never analyzed;
31.6 ms from 50,000 queued after an ANALYZE of 100,000 finished jobs and an empty queue
(docs/benchmarks.md, 2026-12-02 afternoon). O(queue) per claim: a backlog slows every claim,
which grows the backlog; a prepared claim keeps such a plan until the next ANALYZE.

A function's own SET clause is PostgreSQL's way to give one query planner settings of its own:
`enable_sort` and `enable_bitmapscan` are off while jobs_pick runs (and only then: they are put
back when it returns, for the rest of the claim and everything else on the connection), so the
only plan without a disabled node is the ordered walk of jobs_job_pick_idx. PL/pgSQL keeps the
query's plan for the session, so a claim pays a function call, not a planning. `ROWS 10` tells
the claim's own planner what to expect from it (a batch: the default for a function is 1,000
rows, which would turn the claim's UPDATE into a scan of jobs_job).

The rows are locked (FOR UPDATE SKIP LOCKED) inside the function, in the claim's transaction, as
the inline pick did. The function reads with a snapshot taken after the claim statement's own: a
job enqueued between the two can be locked but not seen by the claim's UPDATE; it is then left
for the next claim (its lock ends with the claim's transaction), never claimed twice.

It takes no queue filter: a claim from named queues (JOBS_QUEUES) keeps the inline pick the
planner decides (jobs/core/sql/postgres.py `pick`), since an ordered walk of the whole
index would step over every queued job of the other queues.

PostgreSQL only; nothing on SQLite.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION jobs_pick(lim integer, blocked text[])
RETURNS TABLE (pick_id bigint, pick_queue text, pick_priority smallint,
               pick_run_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_sort = off
SET enable_bitmapscan = off
AS $fn$
BEGIN
    RETURN QUERY
    SELECT j.id, j.queue::text, j.priority, j.run_at FROM jobs_job j
     WHERE j.state = 'queued' AND NOT j.deferred AND j.run_at <= clock_timestamp()
       AND NOT (j.queue = ANY (blocked))
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT lim
       FOR UPDATE OF j SKIP LOCKED;
END
$fn$
"""
DROP = "DROP FUNCTION IF EXISTS jobs_pick(integer, text[])"


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0017_hot_history_unconstrained"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
