"""The claim walks jobs_job_pick_idx in order whatever jobs_job's statistics say (jobs_pick).

When the statistics say almost nothing is queued, the planner estimates one row, and left alone
takes a claim's 8 jobs by sorting every queued row: a bitmap scan on a table never analyzed (a
new deployment, a restored dump, a server with autovacuum off), another index in its own order
on a table analyzed while its queue was empty and then given a burst. O(queue) per claim. Each
test first shows that hazard with EXPLAIN of the pick as the claim wrote it before (so it would
fail without jobs_pick, migration 0018_steady_pick), then reads the plans the real claim ran with
from PostgreSQL itself (auto_explain, nested statements included, reported to this client as
NOTICEs), on each path a claim takes: prepared, unprepared, a limited queue's own transaction,
a caller's transaction. The planner settings never outlive the pick.
"""

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import override_settings

from jobs.core import transitions
from jobs.core.transitions import worker as transitions_worker
from jobs.models import Job
from jobs.ops import queues
from tests.integration import auto_explain

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL plans")
W = "host-steady:1"
# The pick as the claim wrote it inline before jobs_pick.
INLINE_PICK = (
    "SELECT id FROM jobs_job WHERE state = 'queued' AND NOT deferred"
    " AND run_at <= clock_timestamp() ORDER BY priority DESC, run_at, id LIMIT 8"
    " FOR UPDATE SKIP LOCKED"
)


def execute(sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall()) if cur.description else []


def never_analyzed() -> None:
    """10,000 queued jobs on a jobs_job as PostgreSQL sees a table no ANALYZE has reached."""
    execute("INSERT INTO jobs_job (kind) SELECT 'test.echo' FROM generate_series(1, 10000)")
    execute("DELETE FROM pg_statistic WHERE starelid = 'jobs_job'::regclass")
    execute(
        "UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0"
        " WHERE oid = 'jobs_job'::regclass"
        " OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'jobs_job'::regclass)"
    )


def analyzed_empty_then_burst() -> None:
    """100,000 finished jobs and an empty queue at the last ANALYZE, then 50,000 enqueued."""
    execute(
        "INSERT INTO jobs_job (kind, state, attempt, finished_at)"
        " SELECT 'test.echo', 'succeeded', 1, now() FROM generate_series(1, 100000)"
    )
    execute("ANALYZE jobs_job")
    execute("INSERT INTO jobs_job (kind) SELECT 'test.echo' FROM generate_series(1, 50000)")


STATES = {
    "never analyzed": never_analyzed,
    "analyzed empty, then a burst": analyzed_empty_then_burst,
}


@pytest.fixture(params=list(STATES))
def hazard(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """jobs_job in a state whose statistics mislead, the hazard shown, and the plans of every
    statement this connection runs from now on (auto_explain, as notices)."""
    execute("TRUNCATE jobs_job CASCADE")  # a new, empty file whatever ran before
    STATES[request.param]()
    unguarded = "\n".join(str(r[0]) for r in execute("EXPLAIN " + INLINE_PICK))
    assert "Sort" in unguarded, unguarded  # every queued row sorted to take 8
    with auto_explain.plans() as seen:
        yield seen


def assert_walked_in_order(plans: list[str], claims: int) -> None:
    picks = [p for p in plans if "FOR UPDATE OF j SKIP LOCKED" in p and "jobs_pick" not in p]
    assert len(picks) == claims, plans
    for plan in picks:
        assert "Index Scan using jobs_job_pick_idx" in plan, plan
        assert "Sort" not in plan and "Bitmap" not in plan, plan
    outer = [p for p in plans if "Insert on jobs_attempt" in p]
    assert len(outer) == claims, plans
    for plan in outer:  # the claim's UPDATE finds its batch by primary key
        assert "Seq Scan on jobs_job" not in plan, plan
    for name in ("enable_sort", "enable_bitmapscan"):  # only while jobs_pick ran
        assert execute(f"SHOW {name}") == [("on",)]


def claim(n: int = 8) -> list[int]:
    return [c.fence.job_id for c in transitions.claim(W, limit=n, lease_seconds=30)]


def first_queued(n: int) -> list[int]:
    return list(Job.objects.filter(state="queued").order_by("id").values_list("id", flat=True)[:n])


@pytest.mark.django_db(transaction=True)
def test_a_prepared_claim_walks_the_pick_index(hazard):
    expected = first_queued(24)
    got = claim() + claim() + claim()  # prepared from its second execution on
    assert got == expected  # claim order kept
    assert_walked_in_order(hazard, 3)
    assert connection.connection.info.transaction_status == 0  # committed: idle


@pytest.mark.django_db(transaction=True)
def test_an_unprepared_claim_walks_it_too(hazard):
    with override_settings(JOBS={"PREPARED_STATEMENTS": False}):
        assert len(claim()) == 8
    assert_walked_in_order(hazard, 1)


@pytest.mark.django_db(transaction=True)
def test_a_limited_queues_claim_walks_it_in_its_own_transaction(hazard):
    queues.set_limit("default", 50, actor=None)
    transitions_worker._limited.clear()
    assert len(claim()) == 8
    assert_walked_in_order(hazard, 1)


@pytest.mark.django_db
def test_a_claim_inside_a_callers_transaction_walks_it_too(hazard):
    assert len(claim()) == 8
    assert_walked_in_order(hazard, 1)


@pytest.mark.django_db(transaction=True)
def test_the_pick_keeps_the_queue_filter_and_the_blocked_queues():
    # Named queues take the inline pick (an ordered walk would step over the other queues);
    # every queue, jobs_pick, which leaves the paused queue out.
    by_queue = {
        q: [Job.objects.create(kind="test.echo", queue=q).pk for _ in range(3)] for q in "abc"
    }
    queues.pause("b", actor=None)
    got = [
        c.fence.job_id for c in transitions.claim(W, limit=8, lease_seconds=30, queues=["a", "b"])
    ]
    assert got == by_queue["a"]  # b is paused, c not asked for
    assert claim() == by_queue["c"]
