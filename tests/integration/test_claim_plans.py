"""Future work costs the claim nothing: EXPLAIN (ANALYZE, BUFFERS) of the real claim statement
and of the due count, with and without 20,000 jobs scheduled a day ahead.

The pages a statement touches are counted by PostgreSQL itself (shared buffers hit or read), so
the comparison does not depend on the machine's speed: before migration 0010 an idle claim
walked every future row of the pick index (hundreds of pages here; 25 ms at 100,000 rows).
"""

import datetime as dt
import json
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

import jobs
from jobs.core import transitions
from jobs.core.sql.postgres import DEFER_HORIZON_SECONDS
from jobs.models import Job
from tests.integration import auto_explain

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL plans"),
]
FUTURE_ROWS = 20_000
WORKER = "host-plan:1"


def plant_future(n: int = FUTURE_ROWS, priority: int = 0) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_job (kind, priority, run_at) "
            "SELECT 'test.echo', %s, clock_timestamp() + interval '1 day' + g * interval '1 ms' "
            "FROM generate_series(1, %s) g",
            [priority, n],
        )
        cur.execute("ANALYZE jobs_job")


def touched(plan: dict[str, Any]) -> int:
    """Pages of the whole statement: the top node's, plus each CTE's (a data-modifying CTE that
    nothing reads runs after the top node and is not counted in it; a CTE that is read is counted
    twice, the same way with and without the backlog)."""
    total = int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
    stack = list(plan.get("Plans", []))
    while stack:
        node = stack.pop()
        if str(node.get("Subplan Name", "")).startswith("CTE "):
            total += int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])
        stack.extend(node.get("Plans", []))
    return total


def pages(run: Any, marker: str) -> int:
    """Shared buffers touched by the statement `run()` sends whose SQL contains `marker`: it is
    first run under EXPLAIN ANALYZE inside a savepoint rolled back, then for real."""
    seen: list[int] = []

    def explain(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if marker in sql and not seen:
            raw_cursor = context["cursor"].cursor
            raw_cursor.execute("SAVEPOINT plan")
            raw_cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            raw = raw_cursor.fetchone()[0]
            raw_cursor.execute("ROLLBACK TO SAVEPOINT plan")
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
            seen.append(touched(plan))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(explain):
        run()
    assert seen, f"no statement containing {marker!r}"
    return seen[0]


def near(baseline: int) -> int:
    """What the same statement may touch once the table is bigger without walking the backlog:
    every index it descends (and each index an UPDATE writes) may have grown a level. Walking
    20,000 future rows costs hundreds of pages more (before migration 0010, an idle claim went
    from 1 page to 408, a claim of five from 84 to 558, counting the top plan node only)."""
    return int(baseline * 1.25) + 16


def claim() -> None:
    transitions.claim(WORKER, limit=5, lease_seconds=30)


def warm() -> None:
    """Plan the claim's statements now: PL/pgSQL plans jobs_pick's query inside the claim's
    execution -- once per session, and again after an ANALYZE -- and those pages are the
    planner's (one metapage per index of jobs_job), not the walk a claim makes. A claim from a
    named queue takes the inline pick, so jobs_pick is called here itself, with a limit of 0:
    nothing taken, nothing locked."""
    for _ in range(6):
        assert transitions.claim(WORKER, limit=5, lease_seconds=30, queues=["warm-up"]) == []
        with connection.cursor() as cur:
            for blocked in ("{}", "{warm-up}"):  # both of its queries
                cur.execute("SELECT count(*) FROM jobs_pick(0, %s::text[])", [blocked])


def count() -> None:
    transitions.count_due(8)


def test_an_idle_claim_touches_as_many_pages_with_a_future_backlog_as_without():
    warm()
    empty = pages(claim, "FOR UPDATE SKIP LOCKED")
    plant_future()
    assert Job.objects.filter(state="queued").count() == FUTURE_ROWS
    warm()
    loaded = pages(claim, "FOR UPDATE SKIP LOCKED")
    assert loaded <= near(empty), (empty, loaded)


def test_due_work_behind_more_urgent_future_work_is_claimed_without_walking_it():
    for _ in range(10):  # five for each claim measured
        jobs.enqueue("test.echo", priority=0)
    warm()
    baseline = pages(claim, "FOR UPDATE SKIP LOCKED")
    plant_future(priority=10)
    warm()
    loaded = pages(claim, "FOR UPDATE SKIP LOCKED")
    assert loaded <= near(baseline), (baseline, loaded)


def test_the_due_count_does_not_walk_future_work():
    jobs.enqueue("test.echo")
    baseline = pages(count, "FROM blocked")
    plant_future()
    loaded = pages(count, "FROM blocked")
    assert loaded <= near(baseline), (baseline, loaded)


def plant_finished(n: int = FUTURE_ROWS) -> tuple[int, int]:
    """`n` jobs, analyzed while they were a backlog and all finished since, then one due job
    stored after them (statistics not taken again, no vacuum yet): what the scheduler's due count
    meets once a burst has run. Committed (autocommit), as a drain's writes are. Returns the
    table's size in pages and a transaction id given out after the backlog ended."""
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE jobs_job SET (autovacuum_enabled = false)")  # no ANALYZE now
        cur.execute(
            "INSERT INTO jobs_job (kind) SELECT 'test.echo' FROM generate_series(1, %s)", [n]
        )
        cur.execute("ANALYZE jobs_job")
        cur.execute(
            "UPDATE jobs_job SET state = 'succeeded', attempt = 1, finished_at = clock_timestamp()"
        )
        cur.execute("SELECT txid_current()")
        ended = int(cur.fetchone()[0])
    jobs.enqueue("test.echo")  # after the finished rows: the table has no free space before
    with connection.cursor() as cur:
        cur.execute("SELECT pg_relation_size('jobs_job') / current_setting('block_size')::int")
        return int(cur.fetchone()[0]), ended


def counted_in_a_transaction() -> None:
    with transaction.atomic():  # pages() explains inside a savepoint
        count()


@pytest.mark.django_db(transaction=True)
def test_the_due_count_does_not_read_finished_work():
    """The scheduler counts due work on every tick. Counted by a scan of the table (the plan
    PostgreSQL chose for `LIMIT n` without an order, expecting to meet n due rows early from
    statistics taken during a backlog), each tick read every finished job stored ahead of the
    first due one: 17 ms a tick in a soak, 152 ms at 1M finished jobs (here: every page of the
    table). Counted in claim order by jobs_count_due (migration 0021), it walks the pick index
    -- until a vacuum, over the backlog's dead entries too, as a claim does (a sixth of the
    table's pages here)."""
    try:
        table_pages, ended = plant_finished()
        # The first walk since the backlog ran visits its rows and marks their entries dead (a
        # claim's first walk would have); the count measured is a steady tick's. It can mark them
        # only once they are dead to every snapshot (killable_after says which hold them).
        holders = killable_after(ended, deadline=30.0, elsewhere=5.0)
        with auto_explain.plans() as plans:
            assert transitions.count_due(8) == 1
        loaded = pages(counted_in_a_transaction, "FROM blocked")
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE jobs_job RESET (autovacuum_enabled)")
    # The count's own query walks the pick index in claim order; nothing scans the table.
    walk = [p for p in plans if "Scan using jobs_job_pick_idx" in p]
    assert len(walk) == 1 and "Sort" not in walk[0], plans
    assert not any(f"{scan} on jobs_job " in p for p in plans for scan in SCANS), plans
    # Left unmarked, every walk visits each finished row's old version: fewer pages than the
    # table has still (a scan reads them all, up to the due job stored last), not a sixth.
    assert loaded < (table_pages if holders else table_pages / 4), (table_pages, loaded, holders)


SCANS = ("Seq Scan", "Bitmap Heap Scan")
# Sessions whose snapshot is from before the xid `ended` (this database's), or whose own xid is
# (any database's: in every snapshot taken since, it keeps each one's xmin at or before it).
HOLDERS = """
SELECT datname = current_database(), datname, pid, backend_xid, backend_xmin, state,
       left(query, 60)
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid()
   AND ((datname = current_database() AND backend_xmin IS NOT NULL
         AND age(backend_xmin) >= age(%(ended)s::text::xid))
        OR (backend_xid IS NOT NULL AND age(backend_xid) >= age(%(ended)s::text::xid)))
"""


def killable_after(ended: int, deadline: float, elsewhere: float) -> list[tuple[Any, ...]]:
    """Wait until the rows of transactions older than `ended` are dead to every snapshot, so an
    index walk may mark their entries dead; return what still holds them (empty once none does).

    Two kinds of holder: a session of this database with a snapshot from before `ended` (a
    thread or process an earlier test left still closing its transaction: waited for up to
    `deadline` seconds), and a transaction of ANY database on the server holding an xid from
    before `ended`: it is in every snapshot taken here, the walk's own too, and keeps that
    snapshot's xmin -- this database's horizon -- behind it (a suite running on another
    database of a shared server: its transactions held this one back for up to 4 minutes).
    Those are waited for only `elsewhere` seconds: nothing here ends them."""
    started = time.monotonic()
    while True:
        with connection.cursor() as cur:
            cur.execute(HOLDERS, {"ended": str(ended % 2**32)})
            holders = cur.fetchall()
            cur.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            (xmin,) = cur.fetchone()
        if int(xmin) <= ended and not holders:  # a prepared transaction, say
            holders.append((False, "snapshot xmin", xmin))
        waited = time.monotonic() - started
        here = any(h[0] for h in holders)
        if not holders or waited > deadline or (waited > elsewhere and not here):
            return holders
        time.sleep(0.05)


def test_a_row_due_far_ahead_is_deferred_however_it_was_written_and_a_claim_promotes_it():
    plant_future(n=3)
    retried = jobs.enqueue("test.echo")
    (c,) = transitions.claim(WORKER, limit=1, lease_seconds=30)
    transitions.fail(c.fence, "boom", retry_in=3600.0)  # a long backoff is future work too
    assert Job.objects.filter(deferred=True).count() == 4
    assert Job.objects.get(pk=retried.pk).deferred
    with connection.cursor() as cur:  # time passes: the rows come due without a write
        cur.execute("SET LOCAL session_replication_role = replica")  # (no trigger fires)
        cur.execute("UPDATE jobs_job SET run_at = clock_timestamp() - interval '1 s'")
        cur.execute("SET LOCAL session_replication_role = origin")
    first = transitions.claim(WORKER, limit=10, lease_seconds=30)  # promotes them
    later = transitions.claim(WORKER, limit=10, lease_seconds=30)
    assert len(first) + len(later) == 4
    assert not Job.objects.filter(deferred=True).exists()


def test_a_job_due_within_the_horizon_is_not_deferred_and_the_trigger_keeps_the_horizon():
    soon = jobs.enqueue("test.echo", run_at=timezone.now() + dt.timedelta(seconds=30))
    later = jobs.enqueue("test.echo", run_at=timezone.now() + dt.timedelta(seconds=90))
    assert not Job.objects.get(pk=soon.pk).deferred
    assert Job.objects.get(pk=later.pk).deferred
    with connection.cursor() as cur:
        cur.execute("SELECT prosrc FROM pg_proc WHERE proname = 'jobs_job_defer'")
        source = cur.fetchone()[0]
    assert f"interval '{DEFER_HORIZON_SECONDS} seconds'" in source
