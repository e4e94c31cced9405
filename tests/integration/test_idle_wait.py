"""A worker's drain with nothing to do hears of new work through LISTEN, not a poll.

The drain runs in a thread of this process (its own database connection, like a worker), and
jobs are enqueued and committed from the test's connection.
"""

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, connections
from django.test import override_settings

import jobs
from jobs.core.states import JobState
from jobs.models import Job
from jobs.worker import runner, shutdown
from tests.conftest import raw_connection
from tests.wake import waiters

pytestmark = pytest.mark.django_db(transaction=True)


class DrainThread(threading.Thread):
    def __init__(self, budget: float) -> None:
        super().__init__(daemon=True)
        self.budget = budget
        self.ran: int | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        try:
            self.ran = runner.drain(budget_seconds=self.budget, idle_wait=True)
        finally:
            self.ended_at = time.monotonic()
            connections.close_all()


@pytest.fixture
def drain() -> Iterator[type[DrainThread]]:
    started: list[DrainThread] = []

    class Tracked(DrainThread):
        def start(self) -> None:
            started.append(self)
            super().start()

    yield Tracked
    shutdown.begin(0.0)  # whatever is still waiting gives up at once
    for t in started:
        t.join(timeout=10)
    shutdown.reset()


def wait_until(check, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.005)
    return time.monotonic()


def state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def idle_now(t: DrainThread) -> None:
    """Wait until the drain found the queue empty and waits: its LISTEN session holds WAITER
    (jobs/core/sql/queues.py), so enqueues notify it."""

    def listening() -> bool:
        return waiters() > 0

    wait_until(listening, 10)


@override_settings(JOBS={"POLL_SECONDS": 60.0, "IDLE_WAIT_SECONDS": 60.0})
def test_an_idle_drain_claims_a_new_job_on_its_notify_not_on_a_poll(drain):
    t = drain(budget=60.0)
    t.start()
    idle_now(t)
    began = time.monotonic()
    job = jobs.enqueue("test.echo", {"n": 1})  # autocommit: committed, NOTIFY sent
    # the poll is a minute away, so only the NOTIFY can have woken the drain this soon
    done = wait_until(lambda: state(job) == JobState.SUCCEEDED, 10)
    assert done - began < 10
    assert t.is_alive(), "the drain went back to waiting instead of ending"


@override_settings(JOBS={"POLL_SECONDS": 0.2, "IDLE_WAIT_SECONDS": 60.0})
def test_a_retry_coming_due_without_a_notify_is_claimed_by_the_periodic_claim(drain):
    job = Job.objects.create(kind="test.echo", payload={})
    with connection.cursor() as cur:  # due in 1 s; its NOTIFY (at insert) is long gone then
        cur.execute(
            "UPDATE jobs_job SET run_at = clock_timestamp() + interval '1 second' WHERE id = %s",
            [job.pk],
        )
    t = drain(budget=60.0)
    t.start()
    wait_until(lambda: state(job) == JobState.SUCCEEDED, 10)
    assert t.is_alive()


@override_settings(JOBS={"POLL_SECONDS": 0.2, "IDLE_WAIT_SECONDS": 0.5})
def test_an_idle_drain_gives_up_after_idle_wait_seconds(drain):
    t = drain(budget=60.0)
    began = time.monotonic()
    t.start()
    t.join(timeout=10)
    assert not t.is_alive() and t.ran == 0
    assert 0.5 <= t.ended_at - began < 5


@override_settings(JOBS={"POLL_SECONDS": 60.0, "IDLE_WAIT_SECONDS": 60.0})
def test_a_shutdown_ends_an_idle_drain_at_once(drain):
    t = drain(budget=60.0)
    t.start()
    idle_now(t)
    asked = time.monotonic()
    shutdown.begin(30.0)
    t.join(timeout=5)
    assert not t.is_alive()
    assert t.ended_at - asked < 1.0


@override_settings(JOBS={"POLL_SECONDS": 60.0, "IDLE_WAIT_SECONDS": 60.0})
def test_the_in_process_drain_still_returns_at_once_when_idle():
    began = time.monotonic()
    assert runner.drain(budget_seconds=60.0) == 0
    assert time.monotonic() - began < 5


@override_settings(JOBS={"POLL_SECONDS": 60.0, "IDLE_WAIT_SECONDS": 60.0})
def test_a_drain_asks_for_notifies_while_idle_and_not_while_it_runs_a_job(drain):
    """Enqueues notify only while some process waits (migration 0022): a drain that claimed
    work lets go of WAITER until it is idle again, so enqueues meanwhile skip the NOTIFY."""
    t = drain(budget=60.0)
    t.start()
    idle_now(t)
    assert waiters() == 1
    job = jobs.enqueue("test.sleep", {"seconds": 1.5})  # notifies the idle drain
    wait_until(lambda: state(job) == JobState.RUNNING, 10)
    wait_until(lambda: waiters() == 0, 1.0)  # busy: asks for no NOTIFY
    other = jobs.enqueue("test.echo", {"n": 2})  # no NOTIFY; the drain's next claim takes it
    wait_until(lambda: state(other) == JobState.SUCCEEDED, 10)
    assert state(job) == JobState.SUCCEEDED
    wait_until(lambda: waiters() == 1, 10)  # idle again, registered
    assert t.is_alive()


@override_settings(JOBS={"POLL_SECONDS": 60.0, "IDLE_WAIT_SECONDS": 60.0})
def test_a_drain_whose_claim_emptied_the_queue_stays_registered_while_it_runs(drain):
    """A claim that came back short of its batch emptied the queue: the drain is about to wait
    again, so it keeps asking for NOTIFYs (no release and new registration per job)."""
    t = drain(budget=60.0)
    t.start()
    idle_now(t)
    first = jobs.enqueue("test.echo", {"n": 1})  # a claim of 1, full: released
    wait_until(lambda: state(first) == JobState.SUCCEEDED, 10)
    wait_until(lambda: waiters() == 1, 10)  # idle again; its claim batch has grown to 2
    job = jobs.enqueue("test.sleep", {"seconds": 1.0})  # claimed alone: 1 of 2
    wait_until(lambda: state(job) == JobState.RUNNING, 10)
    watch_until = time.monotonic() + 0.5
    while time.monotonic() < watch_until:  # its whole first half second of running
        assert waiters() == 1, "released WAITER after a claim that emptied the queue"
        time.sleep(0.01)
    wait_until(lambda: state(job) == JobState.SUCCEEDED, 10)


@override_settings(JOBS={"POLL_SECONDS": 60.0, "IDLE_WAIT_SECONDS": 60.0})
def test_an_enqueue_in_flight_while_the_drain_starts_to_wait_is_claimed_without_a_notify(drain):
    """The race the FENCE closes, end to end, ten times over: each job is inserted while the
    drain runs the one before (it holds no WAITER then: the INSERT sends no NOTIFY) and
    committed only after the drain has gone idle again. With the poll a minute away, only the
    fence -- the drain's registration waits for that transaction to end, then claims once more
    -- can get the job started within the deadline."""
    t = drain(budget=60.0)
    t.start()
    idle_now(t)
    pk = jobs.enqueue("test.sleep", {"seconds": 0.1}).pk  # slow: every claim is 1 of 1, full

    def now_in(*states: str) -> Callable[[], bool]:
        job = pk  # the job of this step
        return lambda: Job.objects.filter(pk=job, state__in=states).exists()

    with raw_connection(autocommit=False) as producer:
        for _ in range(10):
            wait_until(now_in(JobState.RUNNING), 10)
            wait_until(lambda: waiters() == 0, 5)  # busy with a full claim: not waiting
            (following,) = producer.execute(
                "INSERT INTO jobs_job (kind, payload) VALUES ('test.sleep', '{\"seconds\": 0.1}')"
                " RETURNING id"
            ).fetchone()
            wait_until(now_in(JobState.SUCCEEDED), 10)
            wait_until(lambda: waiters() == 1, 5)  # idle: registered, the fence held by us
            producer.commit()  # no NOTIFY was sent for this job
            pk = following
            wait_until(now_in(JobState.RUNNING, JobState.SUCCEEDED), 5)
    wait_until(now_in(JobState.SUCCEEDED), 10)
    assert t.is_alive()
