"""Races decided by the database: two sessions interleaved step by step, and many claimers.

Each interleaving test opens two real PostgreSQL sessions, runs the first write inside an open
transaction (holding the row), starts the second in a thread, waits until PostgreSQL reports the
second session blocked on that row's lock, then commits the first. Exactly one write may win, in
every order.
"""

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.db import connections

from jobs.core import transitions
from jobs.core.sql import CommitRow, ExpiredRow, PostgresDriver
from jobs.core.states import JobState
from jobs.models import Attempt, Job
from tests.conftest import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)
DRIVER = PostgresDriver()
Op = Callable[[psycopg.Cursor, int], bool]


def _commit(cur: psycopg.Cursor, job: int, result: object, attempt: int = 1) -> bool:
    return DRIVER.commit(cur, "worker-a:1", [CommitRow(job, attempt, result, "")]) == {job}


def _reclaim(cur: psycopg.Cursor, job: int) -> bool:
    row = ExpiredRow(job, 1, "test.echo", None, 0, True, "worker-a:1")
    return DRIVER.reclaim_expired(
        cur, row, terminal=False, charged=True, worker="reaper:1", error=""
    )


OPS: dict[str, Op] = {
    "commit": lambda cur, job: _commit(cur, job, {"by": "commit"}),
    "fail": lambda cur, job: DRIVER.fail(cur, job, 1, "worker-a:1", "boom", None),
    "reclaim": lambda cur, job: _reclaim(cur, job),
    "commit-again": lambda cur, job: _commit(cur, job, {"by": "again"}),
}
PAIRS = [("commit", "reclaim"), ("fail", "reclaim"), ("commit", "fail"), ("commit", "commit-again")]


@pytest.fixture
def sessions() -> Iterator[tuple[psycopg.Connection, psycopg.Connection, psycopg.Connection]]:
    conns = [raw_connection(autocommit=False) for _ in range(3)]
    conns[2].autocommit = True
    try:
        yield conns[0], conns[1], conns[2]
    finally:
        for c in conns:
            c.close()


def wait_until_blocked(observer: psycopg.Connection, pid: int, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"session {pid} never blocked on the row lock")


@pytest.mark.parametrize("first,second", PAIRS + [(b, a) for a, b in PAIRS])
def test_exactly_one_of_two_racing_writes_wins(make_job, sessions, first, second):
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker="worker-a:1")
    s1, s2, observer = sessions
    results: dict[str, bool] = {}

    results[first] = OPS[first](s1.cursor(), job.pk)  # holds the row until s1 commits

    def run_second() -> None:
        results[second] = OPS[second](s2.cursor(), job.pk)
        s2.commit()

    t = threading.Thread(target=run_second)
    t.start()
    wait_until_blocked(observer, s2.info.backend_pid)
    s1.commit()
    t.join(timeout=10)
    assert not t.is_alive()
    assert results == {first: True, second: False}
    job.refresh_from_db()
    expected_state = {
        "commit": JobState.SUCCEEDED,
        "commit-again": JobState.SUCCEEDED,
        "fail": JobState.FAILED,
        "reclaim": JobState.QUEUED,
    }[first]
    assert job.state == expected_state and job.attempt == 1


def test_a_naive_state_only_guard_lets_the_zombie_win(make_job, sessions):
    """Why attempt is in every WHERE: after a reclaim the job is `running` again, so a guard on
    state alone accepts the zombie's commit. Shown on a rolled-back transaction."""
    job = make_job(state=JobState.RUNNING, attempt=2, worker="worker-b:2")  # attempt 1 is a zombie
    s1, _, _ = sessions
    naive = s1.execute(
        "UPDATE jobs_job SET state = 'succeeded', finished_at = now(), lease_expires_at = NULL "
        "WHERE id = %s AND state = 'running'",
        [job.pk],
    ).rowcount
    s1.rollback()
    fenced = _commit(s1.cursor(), job.pk, "zombie", attempt=1)
    s1.rollback()
    assert (naive, fenced) == (1, False)


def test_two_workers_never_claim_the_same_job():
    total, threads_n = 400, 8
    Job.objects.bulk_create([Job(kind="test.echo") for _ in range(total)])
    claimed: list[tuple[int, int]] = []
    lock = threading.Lock()
    start = threading.Barrier(threads_n)

    def claimer(n: int) -> None:
        try:
            start.wait()
            while batch := transitions.claim(f"w:{n}", limit=3, lease_seconds=30):
                with lock:
                    claimed.extend((c.fence.job_id, c.fence.attempt) for c in batch)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(claimed) == total
    assert len(set(claimed)) == total
    assert {a for _, a in claimed} == {1}
    assert Attempt.objects.count() == total
    assert Job.objects.filter(state=JobState.RUNNING, attempt=1).count() == total


def test_every_attempt_number_is_claimed_once_across_reclaims():
    """Claim, expire, reclaim, claim again -- with 6 claimers and a reaper racing throughout."""
    Job.objects.bulk_create([Job(kind="test.echo", max_attempts=50) for _ in range(30)])
    stop = threading.Event()
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        try:
            while not stop.is_set():
                for c in transitions.claim(f"w:{n}", limit=2, lease_seconds=0.01):
                    with lock:
                        seen.append((c.fence.job_id, c.fence.attempt))
        finally:
            connections.close_all()

    def reaper() -> None:
        from jobs.worker import reaper as reaper_module

        try:
            while not stop.is_set():
                reaper_module.reap("reaper:1")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    threads.append(threading.Thread(target=reaper))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            if len(seen) >= 300:
                break
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert len(seen) >= 300
    assert len(seen) == len(set(seen))  # no (job, attempt) claimed twice
    rows = set(Attempt.objects.values_list("job_id", "number"))
    assert rows == set(seen)
    for job_id in {j for j, _ in seen}:
        numbers = sorted(n for j, n in seen if j == job_id)
        assert numbers == list(range(1, len(numbers) + 1))  # no gaps, strictly increasing
