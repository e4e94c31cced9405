"""Races on the embedded SQLite database, decided by its single write lock, across connections.

Each thread below uses its own Django connection, so each is a real sqlite3 connection to the
same file (WAL, IMMEDIATE transactions). The interleaving tests hold the first write's
transaction open, start the second write on another connection, wait until that thread is
provably inside `BEGIN IMMEDIATE` (its innermost Python frame is the SQLite cursor executing
it, while a third connection is refused the write lock), then commit the first: exactly one of
the two writes may win, in every order -- the loser decides against the winner's committed row.
"""

import sqlite3
import sys
import threading
import time
from collections.abc import Callable

import pytest
from django.db import connection, connections, transaction
from django.db.backends.utils import CursorWrapper

from jobs.core import transitions
from jobs.core.sql import CommitRow, ExpiredRow, SqliteDriver
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import reaper

pytestmark = pytest.mark.django_db(transaction=True)
DRIVER = SqliteDriver()
Op = Callable[[CursorWrapper, int], bool]


def _commit(cur: CursorWrapper, job: int, result: object, attempt: int = 1) -> bool:
    return DRIVER.commit(cur, "worker-a:1", [CommitRow(job, attempt, result, "")]) == {job}


def _reclaim(cur: CursorWrapper, job: int) -> bool:
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


def write_lock_is_held() -> bool:
    """True when another connection holds the database's write lock (a raw, non-waiting try)."""
    probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc), exc
        return True
    finally:
        probe.close()


def wait_until_waiting_for_the_lock(thread: threading.Thread, deadline: float = 10.0) -> None:
    """Wait until `thread` is executing BEGIN IMMEDIATE (blocked: the lock is someone else's)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        frame = sys._current_frames().get(thread.ident or -1)
        if frame is not None and "BEGIN IMMEDIATE" in str(frame.f_locals.get("query", "")):
            return
        time.sleep(0.005)
    raise AssertionError("the second writer never reached BEGIN IMMEDIATE")


@pytest.mark.parametrize("first,second", PAIRS + [(b, a) for a, b in PAIRS])
def test_exactly_one_of_two_racing_writes_wins_on_sqlite(make_job, first, second):
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker="worker-a:1")
    results: dict[str, bool] = {}
    holding, release = threading.Event(), threading.Event()

    def run(name: str, hold: bool) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cur:
                results[name] = OPS[name](cur, job.pk)
                if hold:
                    holding.set()
                    assert release.wait(10), "never released"
        finally:
            connections.close_all()

    t1 = threading.Thread(target=run, args=(first, True))
    t1.start()
    assert holding.wait(10), "the first write never ran"
    assert write_lock_is_held()
    t2 = threading.Thread(target=run, args=(second, False))
    t2.start()
    wait_until_waiting_for_the_lock(t2)
    assert second not in results
    release.set()
    for t in (t1, t2):
        t.join(timeout=15)
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


def test_a_zombie_commit_after_a_reclaim_and_a_new_claim_is_rejected_on_sqlite(make_job):
    """The full story through jobs.core.transitions, each step on a connection of its own thread."""
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker="worker-a:1")

    def on_own_connection(fn: Callable[[], object]) -> object:
        out: list[object] = []

        def run() -> None:
            try:
                out.append(fn())
            except Exception as exc:  # noqa: BLE001  (re-raised in the test's thread)
                out.append(exc)
            finally:
                connections.close_all()

        t = threading.Thread(target=run)
        t.start()
        t.join(timeout=15)
        assert not t.is_alive() and out
        if isinstance(out[0], Exception):
            raise out[0]
        return out[0]

    assert on_own_connection(lambda: reaper.reap("reaper:1")) == 1
    claimed = on_own_connection(lambda: transitions.claim("worker-b:2", lease_seconds=30))
    assert [c.fence for c in claimed] == [Fence(job.pk, 2, "worker-b:2")]  # type: ignore[attr-defined]
    with pytest.raises(transitions.LeaseLost):
        on_own_connection(lambda: transitions.commit(Fence(job.pk, 1, "worker-a:1"), "zombie"))
    on_own_connection(lambda: transitions.commit(Fence(job.pk, 2, "worker-b:2"), "owner"))
    job.refresh_from_db()
    assert (job.state, job.attempt, job.result) == (JobState.SUCCEEDED, 2, "owner")
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.attempt_presented, rejected.attempt_current) == (1, 2)


def test_claimers_on_several_connections_never_claim_the_same_job_on_sqlite():
    total, threads_n = 200, 4
    Job.objects.bulk_create([Job(kind="test.echo") for _ in range(total)])
    claimed: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads_n)

    def claimer(n: int) -> None:
        try:
            start.wait()
            while batch := transitions.claim(f"w:{n}", limit=3, lease_seconds=30):
                with lock:
                    claimed.extend((c.fence.job_id, c.fence.attempt) for c in batch)
        except BaseException as exc:  # noqa: BLE001  (asserted below: "database is locked" is a bug)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(claimed) == total
    assert len(set(claimed)) == total
    assert {a for _, a in claimed} == {1}
    assert Attempt.objects.count() == total
    assert Job.objects.filter(state=JobState.RUNNING, attempt=1).count() == total


def test_every_attempt_number_is_claimed_once_across_reclaims_on_sqlite():
    """Claim, expire, reclaim, claim again -- with 3 claimers and 2 reapers racing throughout."""
    Job.objects.bulk_create([Job(kind="test.echo", max_attempts=50) for _ in range(20)])
    stop = threading.Event()
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def loop(body: Callable[[], None]) -> None:
        try:
            while not stop.is_set():
                body()
        except BaseException as exc:  # noqa: BLE001  (asserted below)
            errors.append(exc)
        finally:
            connections.close_all()

    def claim(n: int) -> None:
        for c in transitions.claim(f"w:{n}", limit=2, lease_seconds=0.01):
            with lock:
                seen.append((c.fence.job_id, c.fence.attempt))

    threads = [threading.Thread(target=loop, args=(lambda n=n: claim(n),)) for n in range(3)]
    threads += [
        threading.Thread(target=loop, args=(lambda n=n: reaper.reap(f"reaper:{n}"),))
        for n in range(2)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not errors:
        with lock:
            if len(seen) >= 200:
                break
        time.sleep(0.01)  # the poll interval of a deadline-bound wait
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert len(seen) >= 200
    assert len(seen) == len(set(seen))  # no (job, attempt) claimed twice
    assert set(Attempt.objects.values_list("job_id", "number")) == set(seen)
    for job_id in {j for j, _ in seen}:
        numbers = sorted(n for j, n in seen if j == job_id)
        assert numbers == list(range(1, len(numbers) + 1))  # no gaps, strictly increasing
