"""A blocked queue's backlog is not walked by the other queues' claims (jobs_pick, migration 0019).

A paused queue, or one at its concurrency limit, keeps its backlog queued. When that backlog sits
at the head of the claim order, a pick that walks jobs_job_pick_idx and filters the blocked rows
out steps over all of them on every claim (O(blocked backlog) per claim, for every worker). With
a queue blocked, jobs_pick takes each other queue's next rows from jobs_job_queue_pick_idx and
merges them in claim order. The plans are read from PostgreSQL itself (auto_explain with
ANALYZE, nested statements, reported to this client as notices): no node of the pick may throw
away more rows than a claim takes, whatever the statistics say; the order across the other
queues stays the claim order; rows a queue gave beyond the batch are free again once the claim
ends; a concurrent claim skips the rows another claim holds on this path too.
"""

import re
from collections.abc import Iterator

import pytest
from django.db import connection

from jobs.core import transitions
from jobs.core.transitions import worker as transitions_worker
from jobs.models import Job
from jobs.ops import queues
from tests.conftest import raw_connection
from tests.integration import auto_explain

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL plans")
W = "host-blocked:1"
BACKLOG = 20_000


def execute(sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall()) if cur.description else []


def claim(n: int = 8) -> list[int]:
    return [c.fence.job_id for c in transitions.claim(W, limit=n, lease_seconds=30)]


def backlog_at_the_head(queue: str) -> list[int]:
    """BACKLOG jobs in `queue`, an hour older than anything else, and 40 due jobs in `default`
    behind them; returns the default jobs' ids in claim order."""
    execute("TRUNCATE jobs_job CASCADE")
    execute(
        "INSERT INTO jobs_job (kind, queue, run_at) SELECT 'test.echo', %s,"
        " now() - interval '1 hour' FROM generate_series(1, %s)",
        [queue, BACKLOG],
    )
    return [Job.objects.create(kind="test.echo").pk for _ in range(40)]


def never_analyzed() -> None:
    execute("DELETE FROM pg_statistic WHERE starelid = 'jobs_job'::regclass")
    execute(
        "UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0"
        " WHERE oid = 'jobs_job'::regclass"
        " OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'jobs_job'::regclass)"
    )


STATISTICS = {"analyzed": lambda: execute("ANALYZE jobs_job"), "never analyzed": never_analyzed}


@pytest.fixture
def plans() -> Iterator[list[str]]:
    """The plans, with row counts, of every statement this connection runs from now on."""
    with auto_explain.plans(analyze=True) as seen:
        yield seen


def assert_stepped_over_nothing(plans: list[str]) -> None:
    picks = [p for p in plans if "FOR UPDATE OF j SKIP LOCKED" in p and "jobs_pick(" not in p]
    assert len(picks) == 1, plans
    pick = picks[0]
    assert "jobs_job_queue_pick_idx" in pick, pick
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", pick)]
    assert max(removed, default=0) <= 8, pick  # not the blocked backlog
    assert "JIT" not in pick, pick  # never compiled per call (jit off in jobs_pick)


@pytest.mark.parametrize("statistics", list(STATISTICS))
@pytest.mark.django_db(transaction=True)
def test_a_paused_queues_backlog_is_not_walked(plans, statistics):
    default = backlog_at_the_head("bulk")
    queues.pause("bulk", actor=None)
    STATISTICS[statistics]()
    plans.clear()
    assert claim() == default[:8]
    assert_stepped_over_nothing(plans)


@pytest.mark.django_db(transaction=True)
def test_a_queue_at_its_limit_is_not_walked_either(plans):
    default = backlog_at_the_head("bulk")
    execute("ANALYZE jobs_job")
    queues.set_limit("bulk", 1, actor=None)
    transitions_worker._limited.clear()  # this process learns of the limit now, not later
    first = claim(1)  # the oldest bulk job: the limit's one slot
    assert first and first[0] not in default
    plans.clear()
    assert claim() == default[:8]  # bulk is at its limit: blocked
    assert_stepped_over_nothing(plans)


@pytest.mark.parametrize("statistics", list(STATISTICS))
@pytest.mark.django_db(transaction=True)
def test_nor_is_work_due_far_ahead(plans, statistics):
    backlog_at_the_head("bulk")
    execute("DELETE FROM jobs_job WHERE queue = 'default'")
    execute(  # deferred: in the queue-depth index, never in the two pick indexes
        "INSERT INTO jobs_job (kind, run_at) SELECT 'test.echo', now() + interval '1 day'"
        " FROM generate_series(1, %s)",
        [BACKLOG],
    )
    queues.pause("bulk", actor=None)
    STATISTICS[statistics]()
    plans.clear()
    assert claim() == []  # nothing due outside the paused queue
    assert_stepped_over_nothing(plans)


@pytest.mark.django_db(transaction=True)
def test_the_claim_order_across_the_other_queues_is_kept():
    execute("TRUNCATE jobs_job CASCADE")
    for i in range(60):  # three queues, interleaved priorities and times, and a paused one
        Job.objects.create(
            kind="test.echo",
            queue="abcp"[i % 4],
            priority=(i * 7) % 3,
            run_at=execute(f"SELECT now() - interval '{(i * 13) % 17} seconds'")[0][0],
        )
    queues.pause("p", actor=None)
    expected = [
        r[0]
        for r in execute(
            "SELECT id FROM jobs_job WHERE queue <> 'p' ORDER BY priority DESC, run_at, id"
        )
    ]
    got: list[int] = []
    while batch := claim(4):
        got += batch
    assert got == expected
    assert Job.objects.filter(queue="p", state="queued").count() == 15


@pytest.mark.django_db(transaction=True)
def test_rows_another_claim_holds_are_skipped_and_then_free_again():
    execute("TRUNCATE jobs_job CASCADE")
    ids = {q: [Job.objects.create(kind="test.echo", queue=q).pk for _ in range(4)] for q in "ab"}
    queues.pause("p", actor=None)
    other = raw_connection(autocommit=False)
    try:
        # Another claim in flight: its pick of 2 locks up to 2 rows in each queue.
        held = [r[0] for r in other.execute("SELECT pick_id FROM jobs_pick(2, '{p}')")]
        assert held == [ids["a"][0], ids["a"][1]]  # a's rows come first (older ids)
        assert claim(4) == ids["a"][2:] + ids["b"][2:]  # b's first two are held too
    finally:
        other.rollback()  # that claim ends: everything it held, taken or not, is free
        other.close()
    assert claim(8) == ids["a"][:2] + ids["b"][:2]
