"""Wake-ups only for the queues a process serves: each queue has a NOTIFY channel of its own.

Before migration 0010 every enqueue notified one channel with no payload, so a cluster serving
queue `a` woke (and claimed in vain) for every enqueue into any queue.
"""

import pytest
from django.db import connection

import jobs
from jobs.core.sql.queues import ENQUEUED_CHANNEL, WAIT_SQL, queue_channel
from jobs.models import Job
from jobs.ops import queues
from jobs.worker import listener

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="LISTEN/NOTIFY"),
]


def woke(waker: listener.Waker, timeout: float) -> bool:
    return waker.wait(timeout)


def waiting(waker: listener.Waker) -> None:
    """A new Waker's first two waits return at once: the fresh LISTEN, then the passed fence
    (its registration as a waiter, so that enqueues notify it)."""
    assert woke(waker, 0.1)
    assert woke(waker, 0.1)


def test_a_waker_for_queue_a_sleeps_through_enqueues_into_b_and_wakes_for_a():
    waker = listener.Waker(queues=["a"])
    try:
        waiting(waker)
        jobs.enqueue("test.echo", queue="b")
        assert not woke(waker, 0.5)
        jobs.enqueue("test.echo", queue="a")
        assert woke(waker, 5.0)
    finally:
        waker.close()


def test_a_waker_for_every_queue_wakes_for_any_enqueue():
    waker = listener.Waker()
    try:
        waiting(waker)
        jobs.enqueue("test.echo", queue="b")
        assert woke(waker, 5.0)
    finally:
        waker.close()


def test_raising_or_removing_a_queues_limit_wakes_its_waiters_and_lowering_it_does_not():
    # Jobs held back by the old limit may start now: woken as an enqueue would wake them.
    waker = listener.Waker(queues=["a"])
    try:
        waiting(waker)
        queues.set_limit("a", 2, actor=None)  # a first limit lowers: nothing more may start
        assert not woke(waker, 0.5)
        queues.set_limit("a", 1, actor=None)
        assert not woke(waker, 0.5)
        queues.set_limit("a", 3, actor=None)
        assert woke(waker, 5.0)
        queues.set_limit("b", None, actor=None)  # another queue's: not ours
        assert not woke(waker, 0.5)
        queues.set_limit("a", None, actor=None)
        assert woke(waker, 5.0)
    finally:
        waker.close()


def test_one_statement_inserting_many_rows_notifies_once_per_queue(second_connection):
    second_connection.execute(WAIT_SQL)  # a waiter: enqueues notify
    second_connection.execute(f"LISTEN {ENQUEUED_CHANNEL}")
    second_connection.execute(f"LISTEN {queue_channel('a')}")
    Job.objects.bulk_create([Job(kind="test.echo", queue=q) for q in ["a", "a", "a", "b", "b"]])
    heard = list(second_connection.notifies(timeout=1.0))
    assert sorted((n.channel, n.payload) for n in heard) == sorted(
        [(ENQUEUED_CHANNEL, "a"), (ENQUEUED_CHANNEL, "b"), (queue_channel("a"), "")]
    )


def test_the_trigger_names_a_queue_channel_as_python_does():
    with connection.cursor() as cur:
        cur.execute("SELECT 'jobs_q_' || md5(%s)", ["mail.eu-1"])
        assert cur.fetchone()[0] == queue_channel("mail.eu-1")
