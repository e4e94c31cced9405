"""The pipelined commit: a batch's successes are committed by the drain's background thread while
the runner claims the next batch -- never lost, never more than one hand-over on its way and one
waiting behind it, and "flushed" still means "committed" to the runner
(jobs/worker/successes.py)."""

import threading
import time

import pytest
from django.test import override_settings

import jobs
from jobs.core.states import JobState
from jobs.models import Attempt, Job
from jobs.worker import completer, runner
from jobs.worker.successes import Successes

pytestmark = pytest.mark.django_db(transaction=True)
DEADLINE = 20.0  # seconds any wait below may take on a slow machine before the test fails
HANDED_OVER = threading.Event()  # the drain's thread has taken a commit (set by commits_by_thread)


@pytest.fixture(autouse=True)
def _fresh_event():
    HANDED_OVER.clear()


@pytest.fixture
def batches(monkeypatch):
    """The ids of each claim's batch, in order; after the drain's first claim (of one job, as
    every drain starts) the batch grows to its cap at once whatever the machine's speed."""
    claimed: list[list[int]] = []
    real = runner.transitions.claim

    def claim(*args, **kwargs):
        if len(claimed) == 1:
            # The second claim waits until the drain's thread has taken the first batch's
            # commit: on a loaded machine that thread may be scheduled only after the runner
            # ended its next batch too, and the runner then commits both batches itself
            # (correct, not pipelined, and not what these tests look at).
            HANDED_OVER.wait(DEADLINE)
        rows = real(*args, **kwargs)
        claimed.append([c.fence.job_id for c in rows])
        return rows

    monkeypatch.setattr(runner.transitions, "claim", claim)
    monkeypatch.setattr(
        runner.policy, "next_claim_batch", lambda current, per_job, cap, claim_seconds=0.0: cap
    )
    return claimed


def commits_by_thread(monkeypatch, before_commit=None):
    """Record which thread ran each commit of the drain (the real commit, on its own thread's
    connection); `before_commit(thread_name, call_number)` runs first."""
    seen: list[tuple[str, list[int]]] = []
    real = completer.commit

    def commit(items):
        name = threading.current_thread().name
        seen.append((name, [i.held.fence.job_id for i in items]))
        if name == "jobs-heartbeat":
            HANDED_OVER.set()
        if before_commit is not None:
            before_commit(name, len(seen))
        real(items)

    monkeypatch.setattr(runner.completer, "commit", commit)
    return seen


def every_job_succeeded_once(ids):
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {
        JobState.SUCCEEDED
    }
    assert Attempt.objects.filter(job_id__in=ids).count() == len(ids)


def test_a_batch_is_committed_by_the_drains_thread_while_the_runner_claims_the_next(
    monkeypatch, batches
):
    ids = [jobs.enqueue("test.echo", {"n": n}).pk for n in range(12)]
    claimed_again = threading.Event()
    overlapped = []

    def before_commit(thread, number):
        if number == 1:
            # The first batch's commit, held here until the runner has claimed again: only a
            # commit that runs beside the claim lets that happen.
            overlapped.append(claimed_again.wait(DEADLINE))

    seen = commits_by_thread(monkeypatch, before_commit)
    real_claim = runner.transitions.claim

    def claim(*args, **kwargs):
        rows = real_claim(*args, **kwargs)
        if len(batches) >= 2:
            claimed_again.set()
        return rows

    monkeypatch.setattr(runner.transitions, "claim", claim)
    assert runner.drain() == 12
    assert overlapped == [True], "the runner did not claim while the batch's commit was held"
    assert seen[0] == ("jobs-heartbeat", batches[0])
    every_job_succeeded_once(ids)


@override_settings(JOBS={"CLAIM_BATCH": 4, "IDLE_WAIT_SECONDS": 0.0})
def test_a_batch_ending_while_a_hand_over_is_on_its_way_waits_behind_it(monkeypatch, batches):
    # Claims of 1, 4 and 4: the second batch ends while the first one's commit is held. It is
    # handed over all the same, and the runner claims the third batch instead of committing the
    # second itself (and waiting for the first: until 2026-12-05 it did both, and this test
    # waited out its deadline).
    ids = [jobs.enqueue("test.echo", {"n": n}).pk for n in range(9)]
    third_claimed = threading.Event()
    held_up = []

    def before_commit(thread, number):
        if number == 1:  # the first hand-over: held until the runner has claimed again twice
            held_up.append(third_claimed.wait(DEADLINE))

    seen = commits_by_thread(monkeypatch, before_commit)
    real_claim = runner.transitions.claim

    def claim(*args, **kwargs):
        rows = real_claim(*args, **kwargs)
        if len(batches) >= 3:
            third_claimed.set()
        return rows

    monkeypatch.setattr(runner.transitions, "claim", claim)
    assert runner.drain() == 9
    assert held_up == [True], f"the runner stopped to commit behind the held hand-over: {seen}"
    assert [len(b) for b in batches[:3]] == [1, 4, 4]
    assert seen[0] == ("jobs-heartbeat", batches[0])
    # The second batch was never committed alone on the runner's thread (the thread commits it
    # next, or, if the third batch ended first, the runner commits both: the next test).
    assert ("MainThread", batches[1]) not in seen, seen
    every_job_succeeded_once(ids)


@override_settings(JOBS={"CLAIM_BATCH": 4, "IDLE_WAIT_SECONDS": 0.0})
def test_the_runner_commits_itself_when_one_hand_over_is_on_its_way_and_one_waits(
    monkeypatch, batches
):
    # Claims of 1, 4, 4 and 4 while the first hand-over is held: the second batch waits behind
    # it, and the third batch's end, finding both places taken, commits on the runner's thread
    # -- the second batch with it -- so the runner never runs more than three batches ahead.
    ids = [jobs.enqueue("test.echo", {"n": n}).pk for n in range(13)]
    runner_committed = threading.Event()
    held_up = []

    def before_commit(thread, number):
        if number == 1:  # the first hand-over: held until a later batch's commit has happened
            held_up.append(runner_committed.wait(DEADLINE))
        elif thread == "MainThread":
            runner_committed.set()

    seen = commits_by_thread(monkeypatch, before_commit)
    assert runner.drain() == 13
    assert held_up == [True], f"no batch committed on the runner's thread meanwhile: {seen}"
    assert seen[0] == ("jobs-heartbeat", batches[0])
    assert ("MainThread", batches[1] + batches[2]) in seen, seen
    every_job_succeeded_once(ids)


@override_settings(JOBS={"CLAIM_BATCH": 4, "IDLE_WAIT_SECONDS": 0.0})
def test_the_runner_committing_itself_claims_again_without_waiting_for_the_hand_over(
    monkeypatch, batches
):
    # Claims of 1, 4, 4, 4 and 4 while the first hand-over is held (as the drain's first is
    # while the thread opens its connection): the third batch's end commits the second and
    # third on the runner's thread and claims again at once. Until 2026-12-07 that commit then
    # waited for the held one, and the fourth claim came only after it (here: never, until the
    # deadline).
    ids = [jobs.enqueue("test.echo", {"n": n}).pk for n in range(17)]
    fourth_claimed = threading.Event()
    held_up = []

    def before_commit(thread, number):
        if number == 1:  # the first hand-over: held until the runner has claimed a fourth time
            held_up.append(fourth_claimed.wait(DEADLINE))

    seen = commits_by_thread(monkeypatch, before_commit)
    real_claim = runner.transitions.claim

    def claim(*args, **kwargs):
        rows = real_claim(*args, **kwargs)
        if len(batches) >= 4:
            fourth_claimed.set()
        return rows

    monkeypatch.setattr(runner.transitions, "claim", claim)
    assert runner.drain() == 17
    assert held_up == [True], f"the runner waited for the held hand-over: {seen}"
    assert seen[0] == ("jobs-heartbeat", batches[0])
    assert ("MainThread", batches[1] + batches[2]) in seen, seen
    every_job_succeeded_once(ids)


def test_when_the_drain_returns_every_success_handed_over_is_committed(monkeypatch, batches):
    ids = [jobs.enqueue("test.echo", {"n": 0}).pk]  # one batch: its commit is handed over
    release = threading.Event()

    def before_commit(thread, number):
        if thread == "jobs-heartbeat":
            threading.Timer(0.3, release.set).start()  # a slow database, for hand-overs only
            release.wait(DEADLINE)

    seen = commits_by_thread(monkeypatch, before_commit)
    assert runner.drain() == 1
    assert seen == [("jobs-heartbeat", ids)]
    every_job_succeeded_once(ids)


def test_a_flush_from_another_thread_waits_for_the_commit_on_its_way():
    """Successes alone, with real threads: `commit(wait=True)` returns only after a commit
    another thread has on its way has ended."""
    lock = threading.Lock()
    entered, finish = threading.Event(), threading.Event()
    ended: list[str] = []

    def slow_commit(items):
        if items[0] == "first":
            entered.set()
            finish.wait(DEADLINE)
        ended.append(items[0])

    successes = Successes(lock, slow_commit)  # type: ignore[arg-type]
    successes.add("first")  # type: ignore[arg-type]
    other = threading.Thread(target=successes.commit, args=(lambda item: None, False))
    other.start()
    assert entered.wait(DEADLINE)
    assert successes.hand_over() is True  # nothing left here: nothing for the runner to do
    successes.add("second")  # type: ignore[arg-type]
    assert successes.hand_over() is True  # one on its way: this one waits behind it
    assert successes.handed_over
    assert successes.hand_over() is False  # one on its way and one waiting: commit it yourself
    waiter = threading.Thread(target=successes.commit, args=(lambda item: None, True))
    waiter.start()
    deadline = time.monotonic() + DEADLINE
    while "second" not in ended and time.monotonic() < deadline:
        time.sleep(0.01)  # the poll interval of a deadline-bound wait
    assert ended == ["second"]  # its own commit is done ...
    waiter.join(0.2)
    assert waiter.is_alive(), "returned while the other thread's commit was still on its way"
    finish.set()
    waiter.join(DEADLINE)
    other.join(DEADLINE)
    assert not waiter.is_alive() and ended == ["second", "first"]
