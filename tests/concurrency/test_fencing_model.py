"""A stateful model check: any sequence of claims, heartbeats, commits, failures, lease expiries
and reaps by two workers keeps the fencing invariants (DESIGN.md 1, 2, 4).

Hypothesis drives the real transitions against PostgreSQL and compares every outcome with a
model: a write is accepted exactly when the fence it presents is its job's current attempt and
the job is running. Once a job ends, the next claim finds a fresh one, so every step works on
live jobs.
"""

from collections import Counter
from collections.abc import Callable

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from jobs import LeaseLost
from jobs.core import transitions
from jobs.core.states import TERMINAL_STATES, JobState
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import reaper

WORKERS = ("w1:1", "w2:2")
MAX_ATTEMPTS = 20
# Stale writes the model saw presented while a newer attempt ran; the test asserts there were
# some, so a generator that never builds a zombie cannot pass silently.
ZOMBIE_WRITES: list[int] = []


class FencedJobs(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        with connection.cursor() as cur:
            cur.execute("TRUNCATE jobs_job RESTART IDENTITY CASCADE")
        self.fences: dict[str, transitions.Fence] = {}
        self.claims: Counter[int] = Counter()
        self.terminal: dict[int, str] = {}
        self.rejections = 0

    def current(self, job_id: int) -> tuple[str, int]:
        return Job.objects.values_list("state", "attempt").get(pk=job_id)

    def present(self, worker: str, write: Callable[[transitions.Fence], None]) -> None:
        """Run a fenced write; the database must agree with the model, and a loser discards."""
        fence = self.fences.pop(worker)
        state, attempt = self.current(fence.job_id)
        should_land = state == JobState.RUNNING and attempt == fence.attempt
        if state == JobState.RUNNING and not should_land:
            ZOMBIE_WRITES.append(fence.job_id)
        try:
            write(fence)
            landed = True
        except LeaseLost:
            landed = False
            self.rejections += 1
        assert landed == should_land, (worker, fence, state, attempt)
        if landed and self.current(fence.job_id)[0] == JobState.RUNNING:
            self.fences[worker] = fence  # a heartbeat: the worker still owns the job

    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker: str) -> None:
        if not Job.objects.filter(state__in=[JobState.QUEUED, JobState.RUNNING]).exists():
            Job.objects.create(kind="test.echo", max_attempts=MAX_ATTEMPTS)
        for fence in [c.fence for c in transitions.claim(worker, limit=1, lease_seconds=30)]:
            self.claims[fence.job_id] += 1
            assert fence.attempt == self.claims[fence.job_id]  # each value once, in order
            self.fences[worker] = fence  # a worker still holding an older fence: now a zombie

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(sorted(self.fences)))
        self.present(worker, lambda f: transitions.heartbeat(f, 30))

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        worker = data.draw(st.sampled_from(sorted(self.fences)))
        self.present(worker, lambda f: transitions.commit(f, {"by": f.attempt}))

    @precondition(lambda self: self.fences)
    @rule(data=st.data(), retry=st.booleans())
    def fail(self, data: st.DataObject, retry: bool) -> None:
        worker = data.draw(st.sampled_from(sorted(self.fences)))
        self.present(worker, lambda f: transitions.fail(f, "boom", 0.0 if retry else None))

    @rule()
    def lease_runs_out(self) -> None:
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE jobs_job SET lease_expires_at = clock_timestamp() - interval '1 second' "
                "WHERE state = 'running'"
            )

    @rule(expire_first=st.booleans())
    def reap(self, expire_first: bool) -> None:
        if expire_first:
            self.lease_runs_out()
        reaper.reap("reaper:0")

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def another_worker_takes_over(self, data: st.DataObject) -> None:
        """The usual way a zombie is born: its lease runs out, the reaper reclaims the job and
        a different worker claims it, while the first still holds its fence."""
        holder = data.draw(st.sampled_from(sorted(self.fences)))
        self.reap(expire_first=True)
        self.claim(next(w for w in WORKERS if w != holder))

    @invariant()
    def a_terminal_state_is_reached_once_and_kept(self) -> None:
        for job_id, state in Job.objects.values_list("id", "state"):
            if job_id in self.terminal:
                assert state == self.terminal[job_id]
            elif state in TERMINAL_STATES:
                self.terminal[job_id] = state

    @invariant()
    def attempts_are_claimed_once_each_within_the_limit(self) -> None:
        for job_id, attempt in Job.objects.values_list("id", "attempt"):
            numbers = list(Attempt.objects.filter(job_id=job_id).values_list("number", flat=True))
            assert numbers == list(range(1, attempt + 1)) and attempt == self.claims[job_id]
            assert attempt <= MAX_ATTEMPTS

    @invariant()
    def a_success_holds_the_result_of_the_attempt_that_committed(self) -> None:
        for job in Job.objects.filter(state=JobState.SUCCEEDED):
            assert job.result == {"by": job.attempt}

    @invariant()
    def every_rejection_is_recorded(self) -> None:
        assert RejectedWrite.objects.exclude(write="reclaim").count() == self.rejections


@pytest.mark.django_db(transaction=True)
def test_fencing_invariants_hold_for_any_sequence_of_operations() -> None:
    ZOMBIE_WRITES.clear()
    FencedJobs.TestCase.settings = settings(
        max_examples=60,
        stateful_step_count=25,
        deadline=None,
        derandomize=True,  # the same sequences on every run: no flaky passes or failures
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    FencedJobs.TestCase().runTest()
    assert ZOMBIE_WRITES, "no generated sequence had a zombie write while a newer attempt ran"
