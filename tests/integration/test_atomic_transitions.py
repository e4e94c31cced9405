"""Every transition changes the job, its attempt and its events together or not at all.

On PostgreSQL the transitions run in autocommit, so each must be one statement: each is counted
as one, and each that writes more than the job row (claim, heartbeat, commit and the batch
commit, fail, release, reclaim, poison) is cut: a second connection locks a row the transition
needs (the attempt row, once the statement has moved the job; for the claim, an advisory lock
its event rows wait on; for a poison, the event table), the transition's connection is cut
while it waits (pg_terminate_backend), and the state is all or nothing -- and the write
presented again after the cut lands without a false rejection. A checkpoint writes the job row
alone: it is counted, not cut. The tests named test_refused_* run on SQLite too
(tests/sqlite/test_atomic_transitions.py): a trigger refuses the event row, and nothing of the
transition remains.
"""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

import jobs
from jobs.core import transitions
from jobs.core.sql import IntentRow, driver_for
from jobs.core.states import AttemptOutcome, JobState
from jobs.core.transitions import Fence
from jobs.core.transitions import worker as worker_transitions
from jobs.models import Attempt, Intent, Job, JobEvent, RejectedWrite
from jobs.worker import reaper
from tests.conftest import on_sqlite, raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

WORKER, REAPER = "host-a:1", "reaper:9"


def claim_one(worker: str = WORKER, lease: float = 30) -> Fence:
    (claimed,) = transitions.claim(worker, limit=1, lease_seconds=lease)
    return claimed.fence


def expire(job_id: int) -> None:
    clock = driver_for(connection.vendor)
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE jobs_job SET lease_expires_at = {clock.later('s')} WHERE id = %(id)s",
            {"s": -1.0, "id": job_id},
        )


def snapshot(job_id: int) -> tuple[str, str, list[str]]:
    """(job state, attempt 1's outcome, the event types after the enqueue and the claim)."""
    events = (
        JobEvent.objects.filter(job_id=job_id)
        .exclude(type__in=["enqueued", "claimed"])
        .order_by("id")
    )
    return (
        Job.objects.get(pk=job_id).state,
        Attempt.objects.get(job_id=job_id, number=1).outcome,
        [e.type for e in events],
    )


# -- PostgreSQL: the connection cut while the transition waits on a lock ----------------------


def _waiting_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cur.fetchone()
    return bool(row and row[0] == "Lock")


def cut_while_blocked(
    transition: Callable[[], Any], hold: str, params: list[Any]
) -> BaseException | None:
    """Run `transition` on a connection of its own while a second connection runs `hold` (a
    lock) in an open transaction; once the transition waits on that lock, terminate its
    backend. Returns what the transition raised."""
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def run() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cur.fetchone()[0]
            started.set()
            transition()
        except BaseException as exc:  # noqa: BLE001  (handed to the test)
            outcome["raised"] = exc
        finally:
            connection.close()

    holder = raw_connection()
    try:
        with holder.transaction():
            holder.execute(hold, params)
            thread = threading.Thread(target=run)
            thread.start()
            assert started.wait(10)
            deadline = time.monotonic() + 10
            while not _waiting_on_a_lock(outcome["pid"]):
                assert time.monotonic() < deadline, "the transition never waited on the lock"
                time.sleep(0.01)  # poll interval of a deadline-bound wait
            with connection.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(%s)", [outcome["pid"]])
            thread.join(10)
            assert not thread.is_alive()
    finally:
        holder.close()
    return outcome.get("raised")


LOCK_ATTEMPT = "SELECT 1 FROM jobs_attempt WHERE job_id = %s AND number = 1 FOR UPDATE"


def test_a_release_cut_mid_way_changes_nothing_and_presented_again_lands_unrejected():
    if on_sqlite():
        pytest.skip("pg_terminate_backend")
    jobs.enqueue("test.echo")
    fence = claim_one()

    raised = cut_while_blocked(lambda: transitions.release(fence), LOCK_ATTEMPT, [fence.job_id])

    assert isinstance(raised, DatabaseError | psycopg.Error), raised
    assert snapshot(fence.job_id) == (JobState.RUNNING, AttemptOutcome.RUNNING, [])
    transitions.release(fence)  # presented again, as the completer does after a cut
    assert snapshot(fence.job_id) == (JobState.QUEUED, AttemptOutcome.RELEASED, ["released"])
    assert not RejectedWrite.objects.exists()


def test_a_reclaim_cut_mid_way_changes_nothing_and_the_next_reap_completes_it():
    if on_sqlite():
        pytest.skip("pg_terminate_backend")
    jobs.enqueue("test.echo")
    fence = claim_one()
    expire(fence.job_id)
    (row,) = transitions.find_expired(10)

    def reclaim() -> None:
        transitions.reclaim_expired(row, terminal=False, charged=True, worker=REAPER)

    raised = cut_while_blocked(reclaim, LOCK_ATTEMPT, [fence.job_id])

    assert isinstance(raised, DatabaseError | psycopg.Error), raised
    assert snapshot(fence.job_id) == (JobState.RUNNING, AttemptOutcome.RUNNING, [])
    assert reaper.reap(REAPER) == 1
    assert snapshot(fence.job_id) == (JobState.QUEUED, AttemptOutcome.EXPIRED, ["expired"])


def test_a_poison_cut_mid_way_changes_nothing():
    if on_sqlite():
        pytest.skip("pg_terminate_backend")
    job = jobs.enqueue("test.echo")

    def poison() -> None:
        transitions.poison(job.pk, "the database refused to claim this job", WORKER)

    # Nothing but the event table is left to lock: a poisoned job has no attempt row.
    raised = cut_while_blocked(poison, "LOCK TABLE jobs_jobevent IN SHARE MODE", [])

    assert isinstance(raised, DatabaseError | psycopg.Error), raised
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert not JobEvent.objects.filter(job=job, type="poisoned").exists()


# The claim has no row of its own to lock before it runs (its attempt row is its own insert): a
# trigger makes each event insert wait on an advisory lock the holder takes, so the claim is
# cut after its jobs were moved (its events are inserted from the rows its UPDATE returned).
HOLD_EVENTS = "SELECT pg_advisory_xact_lock(%s)"
EVENTS_KEY = 424242


@contextmanager
def events_wait_for_the_holder() -> Iterator[None]:
    with connection.cursor() as cur:
        cur.execute(
            "CREATE FUNCTION wait_for_holder() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_advisory_xact_lock_shared({EVENTS_KEY}); RETURN NEW; END $$"
        )
        cur.execute(
            "CREATE TRIGGER wait_for_holder BEFORE INSERT ON jobs_jobevent "
            "FOR EACH ROW EXECUTE FUNCTION wait_for_holder()"
        )
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER wait_for_holder ON jobs_jobevent")
            cur.execute("DROP FUNCTION wait_for_holder()")


def test_a_claim_cut_mid_way_claims_nothing():
    if on_sqlite():
        pytest.skip("pg_terminate_backend")
    first, second = jobs.enqueue("test.echo"), jobs.enqueue("test.echo")

    with events_wait_for_the_holder():
        raised = cut_while_blocked(
            lambda: transitions.claim(WORKER, limit=2, lease_seconds=30), HOLD_EVENTS, [EVENTS_KEY]
        )

    assert isinstance(raised, DatabaseError | psycopg.Error), raised
    for job in (first, second):
        assert Job.objects.filter(pk=job.pk).values_list("state", "attempt").get() == (
            JobState.QUEUED,
            0,
        )
    assert not Attempt.objects.exists()
    assert not JobEvent.objects.exclude(type="enqueued").exists()
    claimed = transitions.claim(WORKER, limit=2, lease_seconds=30)  # the next claim takes them
    assert sorted((c.fence.job_id, c.fence.attempt) for c in claimed) == [
        (first.pk, 1),
        (second.pk, 1),
    ]


def _lease(job_id: int) -> tuple[Any, ...]:
    """What a heartbeat moves: the job's lease and beat, its attempt's beat and confirmation."""
    job = Job.objects.get(pk=job_id)
    attempt = Attempt.objects.get(job_id=job_id, number=job.attempt)
    return (
        job.lease_expires_at,
        job.heartbeat_at,
        attempt.heartbeat_at,
        attempt.running_confirmed_at,
    )


def test_a_heartbeat_cut_mid_way_changes_nothing_and_the_next_beat_lands():
    if on_sqlite():
        pytest.skip("pg_terminate_backend")
    jobs.enqueue("test.echo")
    fence = claim_one()
    before = _lease(fence.job_id)

    def beat() -> None:
        transitions.heartbeat_many([(fence, 300)], confirm=fence)

    raised = cut_while_blocked(beat, LOCK_ATTEMPT, [fence.job_id])

    assert isinstance(raised, DatabaseError | psycopg.Error), raised
    assert _lease(fence.job_id) == before
    assert transitions.heartbeat_many([(fence, 300)], confirm=fence) == set()
    lease, job_beat, attempt_beat, confirmed = _lease(fence.job_id)
    assert lease > before[0] and job_beat > before[1] and attempt_beat > before[2]
    assert confirmed is not None


def test_a_batch_commit_cut_mid_way_commits_none_and_presented_again_lands_unrejected():
    if on_sqlite():
        pytest.skip("pg_terminate_backend")
    jobs.enqueue("test.echo")
    jobs.enqueue("test.echo")
    one, two = (c.fence for c in transitions.claim(WORKER, limit=2, lease_seconds=30))
    items = [(one, {"n": 1}, "ref-1"), (two, {"n": 2}, "ref-2")]
    intents = {two.job_id: [IntentRow("notify", f"{two.job_id}:notify", "test.target", {})]}

    # The second job's attempt row is held: the statement has written the first one's by then.
    raised = cut_while_blocked(
        lambda: transitions.commit_many(items, intents), LOCK_ATTEMPT, [two.job_id]
    )

    assert isinstance(raised, DatabaseError | psycopg.Error), raised
    for fence in (one, two):
        assert snapshot(fence.job_id) == (JobState.RUNNING, AttemptOutcome.RUNNING, [])
    assert not Intent.objects.exists()
    assert transitions.commit_many(items, intents) == []  # presented again, as after a cut
    for fence in (one, two):
        assert snapshot(fence.job_id) == (
            JobState.SUCCEEDED,
            AttemptOutcome.SUCCEEDED,
            ["succeeded"],
        )
    assert list(Intent.objects.values_list("job_id", "attempt", "step")) == [
        (two.job_id, 1, "notify")
    ]
    assert not RejectedWrite.objects.exists()


def test_a_fail_cut_mid_way_changes_nothing_and_presented_again_lands_unrejected():
    if on_sqlite():
        pytest.skip("pg_terminate_backend")
    jobs.enqueue("test.echo")
    fence = claim_one()

    raised = cut_while_blocked(
        lambda: transitions.fail(fence, "boom", None), LOCK_ATTEMPT, [fence.job_id]
    )

    assert isinstance(raised, DatabaseError | psycopg.Error), raised
    assert snapshot(fence.job_id) == (JobState.RUNNING, AttemptOutcome.RUNNING, [])
    assert Job.objects.get(pk=fence.job_id).error == ""
    transitions.fail(fence, "boom", None)  # presented again, as the completer does after a cut
    assert snapshot(fence.job_id) == (JobState.FAILED, AttemptOutcome.FAILED, ["failed"])
    assert Attempt.objects.get(job_id=fence.job_id, number=1).error == "boom"
    assert not RejectedWrite.objects.exists()


def test_a_claim_never_logs_attempt_2_before_the_reclaim_logs_attempt_1_expired():
    if on_sqlite():
        pytest.skip("a second connection holding a row lock")
    job = jobs.enqueue("test.echo")
    fence = claim_one()
    expire(fence.job_id)
    (row,) = transitions.find_expired(10)
    claimed_meanwhile: list[Fence] = []
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def reclaim() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cur.fetchone()[0]
            started.set()
            transitions.reclaim_expired(row, terminal=False, charged=True, worker=REAPER)
        finally:
            connection.close()

    holder = raw_connection()
    try:
        with holder.transaction():
            holder.execute(LOCK_ATTEMPT, [job.pk])
            thread = threading.Thread(target=reclaim)
            thread.start()
            assert started.wait(10)
            deadline = time.monotonic() + 10
            while not _waiting_on_a_lock(outcome["pid"]):
                assert time.monotonic() < deadline, "the reclaim never waited on the lock"
                time.sleep(0.01)  # poll interval of a deadline-bound wait
            # Another worker claims while the reclaim is under way: it must not see the job.
            claimed_meanwhile = [c.fence for c in transitions.claim("host-b:2", lease_seconds=30)]
    finally:
        holder.close()
    thread.join(10)
    assert claimed_meanwhile == []
    second = claim_one("host-b:2")
    assert second.attempt == 2
    events = list(
        JobEvent.objects.filter(job=job)
        .exclude(type="enqueued")
        .order_by("id")
        .values_list("type", "attempt")
    )
    assert events == [("claimed", 1), ("expired", 1), ("claimed", 2)]
    first_ended = Attempt.objects.get(job=job, number=1).ended_at
    assert first_ended <= Attempt.objects.get(job=job, number=2).claimed_at


def test_release_reclaim_and_poison_are_each_one_statement_on_postgresql():
    if on_sqlite():
        pytest.skip("SQLite runs them as several statements in one transaction")
    jobs.enqueue("test.echo")
    released = claim_one()
    jobs.enqueue("test.echo")
    reclaimed = claim_one()
    expire(reclaimed.job_id)
    (row,) = transitions.find_expired(10)
    queued = jobs.enqueue("test.echo")
    for transition in (
        lambda: transitions.release(released),
        lambda: transitions.reclaim_expired(row, terminal=True, charged=True, worker=REAPER),
        lambda: transitions.poison(queued.pk, "refused", WORKER),
    ):
        with CaptureQueriesContext(connection) as queries:
            transition()
        assert len(queries) == 1, [q["sql"] for q in queries]
    assert Job.objects.get(pk=reclaimed.job_id).state == JobState.FAILED
    assert list(
        JobEvent.objects.filter(job_id=reclaimed.job_id)
        .exclude(type="enqueued")
        .order_by("id")
        .values_list("type")
    ) == [("claimed",), ("expired",), ("failed",)]


def test_claim_heartbeat_checkpoint_commit_and_fail_are_each_one_statement_on_postgresql():
    if on_sqlite():
        pytest.skip("SQLite runs them as several statements in one transaction")
    for _ in range(5):
        jobs.enqueue("test.echo")
    worker_transitions._limited.clear()
    transitions.refresh_limits(None)  # the claim below knows its queues are not limited
    with CaptureQueriesContext(connection) as queries:
        claimed = transitions.claim(WORKER, limit=5, lease_seconds=30)
    assert len(queries) == 1, [q["sql"] for q in queries]
    one, two, three, four, five = (c.fence for c in claimed)
    intents = {four.job_id: [IntentRow("notify", f"{four.job_id}:notify", "test.target", {})]}
    for transition in (
        lambda: transitions.heartbeat(one, 60),
        lambda: transitions.heartbeat_many([(one, 60), (two, 60)], confirm=one),
        lambda: transitions.confirm_running(two),
        lambda: transitions.checkpoint(one, {"done": 1}, 60),
        lambda: transitions.commit(one, {"ok": True}),
        lambda: transitions.commit_many([(two, 2, ""), (three, 3, ""), (four, 4, "r")], intents),
        lambda: transitions.fail(five, "boom", None),
    ):
        with CaptureQueriesContext(connection) as queries:
            transition()
        assert len(queries) == 1, [q["sql"] for q in queries]
    assert (
        sorted(Job.objects.values_list("state", flat=True))
        == [JobState.FAILED] + [JobState.SUCCEEDED] * 4
    )
    assert Job.objects.get(pk=one.job_id).progress == {"done": 1}
    assert Intent.objects.filter(job_id=four.job_id).count() == 1
    assert not RejectedWrite.objects.exists()


# -- both drivers: the event row refused, nothing of the transition remains -------------------


def _refuse_events() -> None:
    with connection.cursor() as cur:
        if on_sqlite():
            cur.execute(
                "CREATE TRIGGER refuse_events BEFORE INSERT ON jobs_jobevent "
                "BEGIN SELECT RAISE(ABORT, 'event refused'); END"
            )
        else:
            cur.execute(
                "CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'event refused'; END $$"
            )
            cur.execute(
                "CREATE TRIGGER refuse_events BEFORE INSERT ON jobs_jobevent "
                "FOR EACH ROW EXECUTE FUNCTION refuse_events()"
            )


def test_refused_event_leaves_a_release_undone():
    jobs.enqueue("test.echo")
    fence = claim_one()
    _refuse_events_then(lambda: transitions.release(fence))
    assert snapshot(fence.job_id) == (JobState.RUNNING, AttemptOutcome.RUNNING, [])


def test_refused_event_leaves_a_reclaim_undone():
    jobs.enqueue("test.echo")
    fence = claim_one()
    expire(fence.job_id)
    (row,) = transitions.find_expired(10)
    _refuse_events_then(
        lambda: transitions.reclaim_expired(row, terminal=False, charged=True, worker=REAPER)
    )
    assert snapshot(fence.job_id) == (JobState.RUNNING, AttemptOutcome.RUNNING, [])


def test_refused_event_leaves_a_poison_undone():
    job = jobs.enqueue("test.echo")
    _refuse_events_then(lambda: transitions.poison(job.pk, "refused", WORKER))
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def _refuse_events_then(transition: Callable[[], Any]) -> None:
    _refuse_events()
    try:
        with pytest.raises(DatabaseError, match="event refused"):
            transition()
    finally:
        with connection.cursor() as cur:
            if on_sqlite():
                cur.execute("DROP TRIGGER refuse_events")
            else:
                cur.execute("DROP TRIGGER refuse_events ON jobs_jobevent")
                cur.execute("DROP FUNCTION refuse_events()")
