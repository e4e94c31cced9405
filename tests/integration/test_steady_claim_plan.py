"""The claim walks jobs_job_pick_idx in order whatever jobs_job's statistics say (steady_plan).

On a table never analyzed -- a new deployment, a restored dump, a server with autovacuum off --
the planner estimates a handful of queued rows and, left alone, takes a claim's 8 jobs by a bitmap
scan of every queued row and a sort of them all: O(queue) per claim. Each test first shows that
hazard with EXPLAIN of the claim's pick (so the test would fail without the guard), then reads
the plan the real claim ran with from PostgreSQL itself (auto_explain, reported to this client as
a NOTICE), on every path a claim takes: autocommit prepared (one pipeline: BEGIN, SET LOCAL, the
claim, COMMIT), autocommit unprepared (one simple query), a limited queue's own transaction. The
setting never outlives the claim, and a claim that fails leaves the connection clean.
"""

from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection
from django.test.utils import override_settings

from jobs.core import transitions
from jobs.core.transitions import worker as transitions_worker
from jobs.models import Job
from jobs.ops import queues

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL plans"),
]
W = "host-steady:1"
QUEUED = 10_000  # fewer pages, and the planner's own estimate already walks the index
PICK = (
    "SELECT id FROM jobs_job WHERE state = 'queued' AND NOT deferred"
    " AND run_at <= clock_timestamp() ORDER BY priority DESC, run_at, id LIMIT 8"
    " FOR UPDATE SKIP LOCKED"
)


def never_analyzed() -> None:
    """jobs_job as PostgreSQL sees a table no ANALYZE or VACUUM has reached."""
    with connection.cursor() as cur:
        cur.execute("DELETE FROM pg_statistic WHERE starelid = 'jobs_job'::regclass")
        cur.execute(
            "UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0"
            " WHERE oid = 'jobs_job'::regclass"
            " OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'jobs_job'::regclass)"
        )


def plan_of(sql: str) -> str:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql)
        return "\n".join(r[0] for r in cur.fetchall())


@pytest.fixture
def backlog() -> Iterator[list[str]]:
    """QUEUED jobs on a never-analyzed table, the hazard shown, and the plans of every
    statement this connection runs from now on (auto_explain, as notices)."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_job (kind) SELECT 'test.echo' FROM generate_series(1, %s)", [QUEUED]
        )
    never_analyzed()
    unguarded = plan_of(PICK)
    assert "Bitmap Heap Scan on jobs_job" in unguarded and "Sort" in unguarded, unguarded
    with connection.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        cur.execute("SET auto_explain.log_min_duration = 0")
        cur.execute("SET auto_explain.log_level = 'notice'")
    plans: list[str] = []
    raw = connection.connection

    def keep(diag) -> None:  # type: ignore[no-untyped-def]
        if "Query Text" in (diag.message_primary or ""):
            plans.append(diag.message_primary)

    raw.add_notice_handler(keep)
    yield plans
    raw.remove_notice_handler(keep)
    with connection.cursor() as cur:
        cur.execute("RESET auto_explain.log_min_duration")


def claim_plans(plans: list[str]) -> list[str]:
    return [p for p in plans if "INSERT INTO jobs_attempt" in p]


def assert_walked_in_order(plans: list[str]) -> None:
    ran = claim_plans(plans)
    assert ran, f"no claim plan reported: {plans}"
    for plan in ran:
        assert "Index Scan using jobs_job_pick_idx" in plan, plan
        assert "Bitmap Heap Scan on jobs_job " not in plan, plan


def setting() -> str:
    with connection.cursor() as cur:
        cur.execute("SHOW enable_bitmapscan")
        return str(cur.fetchone()[0])


def test_a_prepared_claim_walks_the_pick_index_on_a_table_never_analyzed(backlog):
    first = Job.objects.order_by("id").values_list("id", flat=True)[:16]
    got = []
    for _ in range(3):  # prepared from the second execution on: the cached plan too
        got += [c.fence.job_id for c in transitions.claim(W, limit=8, lease_seconds=30)]
    assert got[:16] == list(first)  # claim order kept
    assert_walked_in_order(backlog)
    assert len(claim_plans(backlog)) == 3
    assert setting() == "on"  # the claim's transaction only
    assert connection.connection.info.transaction_status == 0  # idle: committed


def test_an_unprepared_claim_walks_it_too(backlog):
    with override_settings(JOBS={"PREPARED_STATEMENTS": False}):
        assert len(transitions.claim(W, limit=8, lease_seconds=30)) == 8
    assert_walked_in_order(backlog)
    assert setting() == "on"


def test_a_limited_queues_claim_walks_it_in_its_own_transaction(backlog):
    queues.set_limit("default", 50, actor=None)
    transitions_worker._limited.clear()
    assert len(transitions.claim(W, limit=8, lease_seconds=30)) == 8
    assert_walked_in_order(backlog)
    assert setting() == "on"


def test_a_failed_claim_leaves_the_connection_clean(backlog, monkeypatch):
    # A claim statement the server refuses (as a row's bad value would): the pipeline's
    # transaction is rolled back, the error is Django's, and the next claim works.
    from jobs.core.sql import steady_plan

    real = steady_plan.execute

    def broken(cur, sql, params, **kw):  # type: ignore[no-untyped-def]
        return real(cur, sql.replace("LIMIT 8", "LIMIT 8 OFFSET -1"), params, **kw)

    monkeypatch.setattr(steady_plan, "execute", broken)
    with pytest.raises(DatabaseError):
        transitions_worker._claim(W, 8, 30.0, None, {})
    assert connection.connection.info.transaction_status == 0
    assert setting() == "on"
    monkeypatch.setattr(steady_plan, "execute", real)
    assert len(transitions.claim(W, limit=8, lease_seconds=30)) == 8
    assert Job.objects.filter(state="running").count() == 8  # nothing of the failed one
