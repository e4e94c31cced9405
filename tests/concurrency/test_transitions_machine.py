"""The stateful property test of every transition (issue 17.4): claim, heartbeat, checkpoint,
commit, fail, release, reclaim, operator requeue and cancel, and token-checked writes to shared
application rows, by three workers that keep stale views (a fence they were given once), against
a small model of each job, on PostgreSQL.

After every step the invariants hold: a write lands exactly when the model says its fence is the
job's current running attempt (and, for a token write, no row of it holds a higher attempt of the
same job); each attempt value is claimed once, in order; a terminal state is kept unless an
operator requeues; a success holds the committing attempt's result; every refusal is recorded
once; and no application row holds a write the model refused.
"""

from collections import Counter
from collections.abc import Callable

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from demo.models import Report
from jobs import LeaseLost
from jobs.core import transitions
from jobs.core.states import JobState, Write
from jobs.effects import fenced
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import reaper

WORKERS = ("w1:1", "w2:2", "w3:3")
ROWS = ("alpha", "beta")
MAX_ATTEMPTS = 30
SEEN: Counter[str] = Counter()  # what the generated sequences exercised (asserted below)


class EveryTransition(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        with connection.cursor() as cur:
            cur.execute(
                "TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, demo_report "
                "RESTART IDENTITY CASCADE"
            )
        for name in ROWS:
            Report.objects.create(name=name)
        self.fences: dict[str, transitions.Fence] = {}
        self.claims: Counter[int] = Counter()
        self.rejections = 0
        self.rows: dict[str, tuple[int | None, int]] = {name: (None, 0) for name in ROWS}

    def current(self, job_id: int) -> tuple[str, int]:
        return Job.objects.values_list("state", "attempt").get(pk=job_id)

    def owns(self, fence: transitions.Fence) -> bool:
        state, attempt = self.current(fence.job_id)
        if state == JobState.RUNNING and attempt != fence.attempt:
            SEEN["zombie_write"] += 1
        return state == JobState.RUNNING and attempt == fence.attempt

    def present(self, worker: str, write: Callable[[transitions.Fence], None], keep: bool) -> None:
        fence = self.fences.pop(worker)
        should_land = self.owns(fence)
        try:
            write(fence)
            landed = True
        except LeaseLost:
            landed = False
            self.rejections += 1
        assert landed == should_land, (worker, fence, self.current(fence.job_id))
        if landed and keep and self.current(fence.job_id)[0] == JobState.RUNNING:
            self.fences[worker] = fence

    def _pick(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.fences)))

    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker: str) -> None:
        if not Job.objects.filter(state__in=[JobState.QUEUED, JobState.RUNNING]).exists():
            Job.objects.create(kind="test.echo", max_attempts=MAX_ATTEMPTS)
        for fence in [c.fence for c in transitions.claim(worker, limit=1, lease_seconds=30)]:
            self.claims[fence.job_id] += 1
            assert fence.attempt == self.claims[fence.job_id]
            self.fences[worker] = fence

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        self.present(self._pick(data), lambda f: transitions.heartbeat(f, 30), keep=True)

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        self.present(
            self._pick(data), lambda f: transitions.checkpoint(f, {"at": f.attempt}, 30), keep=True
        )

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        self.present(self._pick(data), lambda f: transitions.commit(f, {"by": f.attempt}), False)

    @precondition(lambda self: self.fences)
    @rule(data=st.data(), retry=st.booleans())
    def fail(self, data: st.DataObject, retry: bool) -> None:
        self.present(
            self._pick(data), lambda f: transitions.fail(f, "boom", 0.0 if retry else None), False
        )

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        SEEN["release"] += 1
        self.present(self._pick(data), transitions.release, keep=False)

    @precondition(lambda self: self.fences)
    @rule(data=st.data(), names=st.lists(st.sampled_from(ROWS), min_size=1, max_size=2,
                                         unique=True))  # fmt: skip
    def token_write(self, data: st.DataObject, names: list[str]) -> None:
        worker = self._pick(data)
        fence = self.fences[worker]
        allowed = all(
            job != fence.job_id or attempt <= fence.attempt
            for job, attempt in (self.rows[n] for n in names)
        )
        should_land = self.owns(fence) and allowed
        decision = fenced.write(fence, Report.objects.filter(name__in=names), body=repr(fence))
        assert decision.refused != should_land, (fence, names, self.rows)
        if decision.refused:
            SEEN["token_refused"] += 1
            current = decision.attempt_current or fence.attempt
            fenced.record_rejection(fence, Write.TOKEN, decision.resource, current)
            self.rejections += 1
            self.fences.pop(worker)
        else:
            SEEN["token_accepted"] += 1
            for n in names:
                self.rows[n] = (fence.job_id, fence.attempt)

    @rule()
    def lease_runs_out(self) -> None:
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE jobs_job SET lease_expires_at = clock_timestamp() - interval '1 second' "
                "WHERE state = 'running'"
            )

    @rule(expire_first=st.booleans())
    def reclaim(self, expire_first: bool) -> None:
        if expire_first:
            self.lease_runs_out()
        reaper.reap("reaper:0")

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def another_worker_takes_over(self, data: st.DataObject) -> None:
        """How a zombie is born: its lease runs out, the job is reclaimed and claimed by
        another worker, while the first still holds its fence."""
        holder = self._pick(data)
        self.reclaim(expire_first=True)
        self.claim(next(w for w in WORKERS if w != holder))

    @rule(
        data=st.data(),
        action=st.sampled_from(["requeue", "cancel"]),
        running_only=st.booleans(),
    )
    def operator(self, data: st.DataObject, action: str, running_only: bool) -> None:
        """An operator takes a job back: often a running one (its holder becomes a zombie)."""
        jobs = Job.objects.filter(state=JobState.RUNNING) if running_only else Job.objects.all()
        ids = list(jobs.values_list("id", flat=True))
        if not ids:
            return
        job_id = data.draw(st.sampled_from(ids))
        before = self.current(job_id)[0]
        result = getattr(transitions, action)(job_id, "operator:test")
        if before == JobState.RUNNING and result.changed:
            SEEN[f"{action}_running"] += 1

    @invariant()
    def attempts_are_claimed_once_each_within_the_limit(self) -> None:
        for job_id, attempt, released in Job.objects.values_list(
            "id", "attempt", "attempts_released"
        ):
            numbers = list(Attempt.objects.filter(job_id=job_id).values_list("number", flat=True))
            assert numbers == list(range(1, attempt + 1)) and attempt == self.claims[job_id]
            assert attempt - released <= MAX_ATTEMPTS  # charged attempts within the limit

    @invariant()
    def a_success_holds_the_result_of_the_attempt_that_committed(self) -> None:
        for job in Job.objects.filter(state=JobState.SUCCEEDED):
            assert job.result == {"by": job.attempt}

    @invariant()
    def every_refusal_is_recorded_once(self) -> None:
        assert RejectedWrite.objects.exclude(write="reclaim").count() == self.rejections

    @invariant()
    def rows_hold_only_what_the_model_accepted(self) -> None:
        for name, job, attempt in Report.objects.values_list(
            "name", "fence_job_id", "fence_attempt"
        ):
            assert (job, attempt if job else 0) == self.rows[name], (name, job, attempt)


@pytest.mark.django_db(transaction=True)
def test_every_transition_keeps_the_invariants_for_any_sequence() -> None:
    SEEN.clear()
    EveryTransition.TestCase.settings = settings(
        max_examples=50,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,  # the same sequences on every run
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    EveryTransition.TestCase().runTest()
    exercised = ("zombie_write", "release", "token_refused", "token_accepted",
                 "requeue_running", "cancel_running")  # fmt: skip
    for kind in exercised:
        assert SEEN[kind], f"no generated sequence exercised {kind}"
