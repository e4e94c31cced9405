"""A claim while some queue is blocked takes the other queues' rows queue by queue (jobs_pick).

jobs_pick (0018) walks jobs_job_pick_idx in claim order and filters out the rows of blocked
queues: paused queues, and queues at their concurrency limit (or whose control row another claim
holds). A blocked queue's backlog stays queued, so when it sits at the head of that order (older,
or of higher priority), every claim of every worker steps over all of it before reaching a row it
may take. Measured before this migration (a claim of 8 from `default`, 4,000 due there, p50 of 30
claims): 3.2 ms beside nothing paused, 4.3 ms beside 10,000 paused jobs, 24.8 ms beside 100,000 --
O(blocked backlog) per claim, so pausing one big queue in an incident slowed every other queue
of the cluster (docs/benchmarks.md, 2026-12-02 evening).

Now, when `blocked` is not empty, jobs_pick:
- lists the queues that have queued, not deferred rows by a skip scan of jobs_job_queue_pick_idx
  (queue, priority DESC, run_at, id): one index probe per queue, blocked or not, whatever its
  backlog;
- takes from each queue that is not blocked its first `lim` due rows in claim order from the same
  index, locked FOR UPDATE SKIP LOCKED as before;
- returns the first `lim` of those in claim order (priority DESC, run_at, id): the same rows the
  walk of jobs_job_pick_idx would have given, since each queue's first `lim` contain every row of
  that queue among the overall first `lim`.
The rows a queue gave beyond the ones returned stay locked until the claim's transaction ends (the
claim statement's own, a few milliseconds): a concurrent claim skips them meanwhile, as it skips
any row another claim holds. That costs up to `lim` row locks per queue with due work, paid only
while some queue is blocked; with nothing blocked the pick is the walk of 0018, unchanged.

`jit` is off in the function too: with sorts off, the merge's small sort carries the planner's
penalty cost for a disabled node (10^10), far above `jit_above_cost`, and PostgreSQL compiled the
query with LLVM on every call -- 280 ms a claim, measured, before this setting.

Both of its index reads order by the whole of jobs_job_queue_pick_idx's key (queue first, though
the lateral's queue is fixed): no other index gives that order, and sorts are off, so neither
can be served by jobs_job_queue_depth_idx, whose rows include deferred jobs (EXPLAIN showed the
planner taking it for the skip scan when the ORDER BY named the queue alone; with many jobs
deferred far ahead each probe would step over them), nor by jobs_job_pick_idx filtered by queue
(which would step over the blocked backlog again).

And `plan_cache_mode = force_generic_plan`: PL/pgSQL prepares the function's queries once per
session, but with the limit a parameter PostgreSQL's plan cache judged a generic plan costlier
than one made for the value at hand and planned the pick again on every call (measured from
pgbench, a claim's pick alone: 2,200-2,250 calls/s so, 2,400-3,400 with the generic plan). Sorts
and bitmap scans being off, the generic plan is the same walk.

The new index costs each enqueue one more index entry (a claimed, succeeded or failed version of
a job is outside its predicate): measured in docs/benchmarks.md.

PostgreSQL only; nothing on SQLite (no function there; its claim filters as before).
"""

from importlib import import_module

from django.db import migrations, models
from django.db.models import F, Q

STEADY_PICK = import_module("jobs.migrations.0018_steady_pick")  # its function, to go back to

CREATE = """
CREATE OR REPLACE FUNCTION jobs_pick(lim integer, blocked text[])
RETURNS TABLE (pick_id bigint, pick_queue text, pick_priority smallint,
               pick_run_at timestamptz)
LANGUAGE plpgsql VOLATILE
ROWS 10
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    IF cardinality(blocked) = 0 THEN
        RETURN QUERY
        SELECT j.id, j.queue::text, j.priority, j.run_at FROM jobs_job j
         WHERE j.state = 'queued' AND NOT j.deferred AND j.run_at <= clock_timestamp()
         ORDER BY j.priority DESC, j.run_at, j.id
         LIMIT lim
           FOR UPDATE OF j SKIP LOCKED;
        RETURN;
    END IF;
    RETURN QUERY
    WITH RECURSIVE queues (q) AS (
        (SELECT j.queue FROM jobs_job j
          WHERE j.state = 'queued' AND NOT j.deferred
          ORDER BY j.queue, j.priority DESC, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM jobs_job j
                 WHERE j.state = 'queued' AND NOT j.deferred AND j.queue > queues.q
                 ORDER BY j.queue, j.priority DESC, j.run_at, j.id LIMIT 1)
          FROM queues WHERE queues.q IS NOT NULL
    )
    SELECT c.id, c.queue::text, c.priority, c.run_at
      FROM queues,
           LATERAL (SELECT j.id, j.queue, j.priority, j.run_at FROM jobs_job j
                     WHERE j.queue = queues.q AND j.state = 'queued' AND NOT j.deferred
                       AND j.run_at <= clock_timestamp()
                     ORDER BY j.queue, j.priority DESC, j.run_at, j.id
                     LIMIT lim
                       FOR UPDATE OF j SKIP LOCKED) c
     WHERE queues.q IS NOT NULL AND NOT (queues.q::text = ANY (blocked))
     ORDER BY c.priority DESC, c.run_at, c.id
     LIMIT lim;
END
$fn$
"""


def create(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0018_steady_pick"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                F("priority").desc(),
                models.F("run_at"),
                models.F("id"),
                condition=Q(("deferred", False), ("state", "queued")),
                name="jobs_job_queue_pick_idx",
            ),
        ),
        migrations.RunPython(create, STEADY_PICK.create, elidable=False),
    ]
