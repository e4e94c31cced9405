"""Enqueues notify only while some process waits (migration 0022, jobs/core/sql/queues.py).

A notifying commit takes PostgreSQL's database-wide notification lock until it is done, so
notifying enqueues commit one at a time; the triggers therefore send their NOTIFY only while a
process holds the WAITER lock. These tests hold the protocol to what keeps it safe: a waiter
hears every enqueue committed after it registered, and one that was in flight while it
registered is covered by the fence -- the waiter is told to look again once it has committed.
"""

import time

import psycopg
import pytest
from django.db import connection  # noqa: F401  (the skipif condition reads it)

import jobs
from jobs.core.sql.queues import (
    FENCE_KEY,
    QUEUE_CHANNEL_PREFIX,
    UNWAIT_SQL,
    WAIT_SQL,
    WAITER_KEY,
    WAKE_LOCK_CLASS,
    queue_channel,
)
from jobs.models import Job
from jobs.worker import listener, scheduler
from tests.conftest import raw_connection
from tests.wake import scheduler_running, waiters

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="LISTEN/NOTIFY"),
]

INSERT = "INSERT INTO jobs_job (kind, queue) VALUES ('test.echo', %s)"
REQUEUE = "UPDATE jobs_job SET state = 'queued', finished_at = NULL WHERE id = %s"


def heard(conn: psycopg.Connection, stop_after: int) -> list[str]:
    return [n.channel for n in conn.notifies(timeout=5, stop_after=stop_after)]


def test_an_enqueue_notifies_only_while_a_process_waits(second_connection):
    listening = second_connection  # LISTENs, never registers: it hears only what is sent
    listening.execute(f"LISTEN {queue_channel('nobody')}; LISTEN {queue_channel('someone')}")
    with raw_connection() as producer, raw_connection() as waiter:
        assert waiters(producer) == 0
        producer.execute(INSERT, ["nobody"])  # autocommit: committed, nobody waits
        waiter.execute(WAIT_SQL)
        assert waiters(producer) == 1
        producer.execute(INSERT, ["someone"])
        # Notifications arrive in commit order: had the first been sent, it would come first.
        assert heard(listening, 1) == [queue_channel("someone")]
        waiter.execute(UNWAIT_SQL)
        assert waiters(producer) == 0
        producer.execute(INSERT, ["nobody"])
        waiter.execute(WAIT_SQL)
        producer.execute(INSERT, ["someone"])
        assert heard(listening, 1) == [queue_channel("someone")]


def test_a_requeue_notifies_only_while_a_process_waits(second_connection):
    listening = second_connection
    listening.execute(f"LISTEN {queue_channel('nobody')}; LISTEN {queue_channel('someone')}")
    with raw_connection() as producer, raw_connection() as waiter:
        ids = {}
        for q in ("nobody", "someone"):
            ids[q] = producer.execute(
                "INSERT INTO jobs_job (kind, queue, state, finished_at)"
                " VALUES ('test.echo', %s, 'succeeded', now()) RETURNING id",
                [q],
            ).fetchone()[0]
        producer.execute(REQUEUE, [ids["nobody"]])
        waiter.execute(WAIT_SQL)
        producer.execute(REQUEUE, [ids["someone"]])
        assert heard(listening, 1) == [queue_channel("someone")]


def test_an_enqueue_that_sees_a_waiter_checking_the_fence_notifies(second_connection):
    """FENCE held exclusively (a waiter passing it at that instant): the enqueue cannot tell,
    and notifies -- a NOTIFY too many is always safe."""
    listening = second_connection
    listening.execute(f"LISTEN {queue_channel('racing')}")
    with raw_connection() as producer, raw_connection() as fence:
        fence.execute("SELECT pg_advisory_lock(%s, %s)", [WAKE_LOCK_CLASS, FENCE_KEY])
        producer.execute(INSERT, ["racing"])
        assert heard(listening, 1) == [queue_channel("racing")]


def test_a_new_waiter_looks_again_only_once_enqueues_in_flight_have_committed():
    """The race the fence closes: an enqueue checked for waiters (none) before the Waker
    registered, and commits after. The Waker must not block on LISTEN as if it had seen
    everything: it passes the fence only after that commit, and then says "look again"."""
    waker = listener.Waker(queues=["fenced"])
    with raw_connection() as producer:
        try:
            assert waker.wait(0.1)  # the fresh LISTEN
            producer.execute("BEGIN")
            producer.execute(INSERT, ["fenced"])  # looked: nobody waits; holds FENCE shared
            asked = time.monotonic()
            # registered, but the fence is held: no "look again" -- and no early return either
            # (a caller such as the scheduler would tick on each), the tries back off meanwhile
            assert not waker.wait(0.4)
            assert time.monotonic() - asked >= 0.39
            assert waker._waiting and not waker._fenced
            assert waiters(producer) == 1
            producer.execute("COMMIT")  # sent no NOTIFY: the fence is what tells the waiter
            committed = time.monotonic()
            assert waker.wait(5.0), "the waiter never passed the fence after the commit"
            assert time.monotonic() - committed < 1.0
            assert waker._fenced
            # Registered and past the fence: the next enqueue notifies it.
            assert not waker.wait(0.05)
            producer.execute(INSERT, ["fenced"])
            assert waker.wait(5.0)
        finally:
            waker.close()


def test_a_released_waker_keeps_listening_but_asks_for_no_notify():
    waker = listener.Waker(queues=["released"])
    with raw_connection() as producer:
        try:
            assert waker.wait(0.1)  # fresh
            assert waker.wait(0.1)  # registered, past the fence
            assert waiters(producer) == 1
            waker.release()
            assert waiters(producer) == 0
            assert not waker._waiting
            # listening without registering (the scheduler while work is due)
            assert not waker.wait(0.05, register=False)
            assert waiters(producer) == 0
            assert waker.wait(0.1)  # registered again: past the fence, look again
            assert waiters(producer) == 1
        finally:
            waker.close()
        deadline = time.monotonic() + 5
        while waiters(producer):  # a closed session gives its lock back
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_the_triggers_use_the_lock_numbers_python_uses():
    with raw_connection() as conn:
        rows = conn.execute(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger"
            " WHERE tgrelid = 'jobs_job'::regclass AND tgname LIKE 'jobs_job_enqueued_%'"
        ).fetchall()
    assert {name for name, _ in rows} == {"jobs_job_enqueued_insert", "jobs_job_enqueued_requeue"}
    for _, definition in rows:
        assert f"pg_try_advisory_xact_lock_shared({WAKE_LOCK_CLASS}, {FENCE_KEY})" in definition
        assert f"pg_try_advisory_lock({WAKE_LOCK_CLASS}, {WAITER_KEY})" in definition
        assert f"pg_advisory_unlock({WAKE_LOCK_CLASS}, {WAITER_KEY})" in definition
    assert queue_channel("x").startswith(QUEUE_CHANNEL_PREFIX)


def test_the_scheduler_asks_for_notifies_only_while_nothing_is_due(monkeypatch, settings):
    """With work due the drains are on it, and the scheduler's next tick comes at the poll: it
    listens without registering. With nothing due it registers, and an enqueue wakes it."""
    settings.JOBS = {**getattr(settings, "JOBS", {}), "POLL_SECONDS": 0.1, "IDLE_WAIT_SECONDS": 5}
    ticks: list[bool] = []
    dispatch = scheduler.EmbeddedScheduler.dispatch

    def counted(self: scheduler.EmbeddedScheduler) -> None:
        dispatch(self)
        ticks.append(self._idle)

    monkeypatch.setattr(scheduler.EmbeddedScheduler, "dispatch", counted)
    job = jobs.enqueue("test.echo")  # due, and nothing here drains it
    with scheduler_running(monkeypatch), raw_connection() as probe:
        until(lambda: len(ticks) >= 4)
        assert not any(ticks)
        assert waiters(probe) == 0, "the scheduler asked for NOTIFYs while work was due"
        Job.objects.filter(pk=job.pk).delete()
        until(lambda: waiters(probe) == 1)  # nothing due: it waits, registered
        jobs.enqueue("test.echo")  # notifies it; its tick finds work due and lets go
        until(lambda: waiters(probe) == 0)


def test_without_standing_drains_the_scheduler_always_waits_registered(monkeypatch, settings):
    """JOBS_IDLE_WAIT_SECONDS = 0: no drain stands waiting, the scheduler is the only process
    an enqueue can wake -- it stays registered while work is due too."""
    settings.JOBS = {**getattr(settings, "JOBS", {}), "POLL_SECONDS": 0.1, "IDLE_WAIT_SECONDS": 0}
    jobs.enqueue("test.echo")  # due, and nothing here drains it
    with scheduler_running(monkeypatch) as sched, raw_connection() as probe:
        until(lambda: waiters(probe) == 1)
        assert not sched._idle


def until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.01)
