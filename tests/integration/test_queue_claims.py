"""The claim and the queue controls: claim order, paused queues, concurrency limits, the due count.

Run on PostgreSQL here and on SQLite by tests/sqlite/test_queue_claims.py (the same functions).
"""

import datetime as dt

import pytest
from django.utils import timezone

import jobs
from jobs.core import transitions
from jobs.core.transitions import worker as worker_transitions
from jobs.ops import queues

pytestmark = pytest.mark.django_db
WORKER = "host-q:1"


@pytest.fixture(autouse=True)
def fresh_limits():
    """Each test's claims learn the limits its own rows set (a process re-reads them each s)."""
    worker_transitions._limited.clear()
    yield
    worker_transitions._limited.clear()


def claim(limit: int = 10, queues_: list[str] | None = None) -> list[transitions.Claimed]:
    worker_transitions._limited.clear()
    return transitions.claim(WORKER, limit=limit, lease_seconds=30, queues=queues_)


def ids(claimed: list[transitions.Claimed]) -> list[int]:
    return [c.fence.job_id for c in claimed]


def jobs_in_claim_order() -> list[int]:
    """Five due jobs enqueued out of order; their ids in the order a claim must take them:
    priority (higher first), then due time, then id."""
    now = timezone.now()
    low_old = jobs.enqueue("test.echo", priority=0, run_at=now - dt.timedelta(seconds=30))
    low_new = jobs.enqueue("test.echo", priority=0, run_at=now - dt.timedelta(seconds=20))
    low_tie = jobs.enqueue("test.echo", priority=0, run_at=now - dt.timedelta(seconds=20))
    urgent = jobs.enqueue("test.echo", priority=10, run_at=now - dt.timedelta(seconds=1))
    mid = jobs.enqueue("test.echo", priority=5, run_at=now - dt.timedelta(seconds=5))
    return [urgent.pk, mid.pk, low_old.pk, low_new.pk, low_tie.pk]


def test_a_batch_comes_back_in_claim_order_priority_then_due_time_then_id():
    expected = jobs_in_claim_order()
    assert ids(claim()) == expected


@pytest.mark.parametrize(
    "served", [None, ["default"], ["default", "mail"]], ids=["every", "one", "named"]
)
def test_claims_of_one_job_take_them_in_claim_order_whatever_queues_are_served(served):
    """One at a time, so the pick itself is ordered (a batch is sorted again on its way back):
    a cluster serving named queues (JOBS_QUEUES) picks inline, not through jobs_pick."""
    expected = jobs_in_claim_order()
    assert [ids(claim(1, served)) for _ in expected] == [[pk] for pk in expected]


def test_a_paused_queue_is_not_claimed_until_it_is_resumed():
    queues.pause("mail", actor=None)
    mail = jobs.enqueue("test.echo", queue="mail", priority=9)
    other = jobs.enqueue("test.echo", queue="default")
    assert ids(claim()) == [other.pk]
    assert claim() == []
    assert queues.resume("mail", actor=None)
    assert ids(claim()) == [mail.pk]


def test_a_running_job_of_a_paused_queue_still_commits():
    jobs.enqueue("test.echo", queue="mail")
    (running,) = claim()
    queues.pause("mail", actor=None)
    transitions.commit(running.fence, {"ok": True})  # no LeaseLost: running jobs finish


def test_a_limit_caps_a_batch_and_frees_a_slot_when_a_job_ends():
    queues.set_limit("mail", 2, actor=None)
    for _ in range(5):
        jobs.enqueue("test.echo", queue="mail")
    first = claim()
    assert len(first) == 2
    assert claim() == []  # at its limit
    transitions.commit(first[0].fence, None)
    assert len(claim()) == 1


def test_a_full_queue_leaves_the_other_queues_claimable():
    queues.set_limit("mail", 1, actor=None)
    for _ in range(3):
        jobs.enqueue("test.echo", queue="mail", priority=10)
    other = [jobs.enqueue("test.echo", queue="default") for _ in range(2)]
    assert len(claim(limit=2)) == 1  # one of mail (its room); the batch is cut, not refilled
    assert ids(claim()) == [o.pk for o in other]  # mail is full: the rest, not an empty claim


def test_a_limit_lower_than_the_running_jobs_stops_nothing_and_starts_nothing():
    for _ in range(3):
        jobs.enqueue("test.echo", queue="mail")
    running = claim(limit=2)
    queues.set_limit("mail", 1, actor=None)
    assert claim() == []
    for c in running:
        transitions.commit(c.fence, None)  # the running ones finish
    assert len(claim()) == 1


def test_a_limit_unknown_to_a_claim_blocks_its_queue_rather_than_overshoot():
    jobs.enqueue("test.echo", queue="mail")
    transitions.claim(WORKER, limit=1, lease_seconds=30, queues=["mail"])  # caches "no limit"
    jobs.enqueue("test.echo", queue="mail")
    queues.set_limit("mail", 1, actor=None)
    assert transitions.claim(WORKER, limit=5, lease_seconds=30, queues=["mail"]) == []


def test_the_due_count_leaves_out_paused_and_full_queues():
    jobs.enqueue("test.echo", queue="paused")
    jobs.enqueue("test.echo", queue="full")
    jobs.enqueue("test.echo", queue="full")
    jobs.enqueue("test.echo", queue="default")
    queues.pause("paused", actor=None)
    queues.set_limit("full", 1, actor=None)
    assert transitions.count_due(100) == 3
    assert len(claim(queues_=["full"])) == 1
    assert transitions.count_due(100) == 1
