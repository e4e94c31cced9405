"""Each transition: the claim, and every fenced write rejecting a stale attempt.

Run on PostgreSQL here and on SQLite by tests/sqlite/test_transitions.py (the same functions).
"""

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

import jobs
from jobs.core import transitions
from jobs.core.sql import driver_for
from jobs.core.states import AttemptOutcome, JobState, Write
from jobs.core.transitions import Fence
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from jobs.worker import reaper
from tests.conftest import database_now

pytestmark = pytest.mark.django_db
WORKER = "host-a:101"


def db_now() -> dt.datetime:
    return database_now()


def claim_one(**kw) -> transitions.Claimed:
    (claimed,) = transitions.claim(
        kw.pop("worker", WORKER), lease_seconds=kw.pop("lease", 30), **kw
    )
    return claimed


def test_claim_increments_the_attempt_and_records_who_holds_it():
    job = jobs.enqueue("test.echo", {"x": 1})
    claimed = claim_one()
    job.refresh_from_db()
    assert claimed.fence == Fence(job.pk, 1, WORKER)
    assert (job.state, job.attempt, claimed.payload) == (JobState.RUNNING, 1, {"x": 1})
    attempt = Attempt.objects.get(job=job)
    assert (attempt.number, attempt.worker, attempt.outcome) == (1, WORKER, AttemptOutcome.RUNNING)
    assert JobEvent.objects.filter(job=job, type="claimed", attempt=1).exists()


def test_claim_sets_the_lease_from_the_database_clock():
    jobs.enqueue("test.echo")
    before = db_now()
    claimed = claim_one(lease=42)
    after = db_now()
    lease = Job.objects.get(pk=claimed.fence.job_id).lease_expires_at
    assert before + dt.timedelta(seconds=42) <= lease <= after + dt.timedelta(seconds=42)


def test_a_jobs_own_lease_overrides_the_default():
    jobs.enqueue("test.echo", lease_seconds=5)
    before = db_now()
    claimed = claim_one(lease=600)
    lease = Job.objects.get(pk=claimed.fence.job_id).lease_expires_at
    assert lease < before + dt.timedelta(seconds=60)


def test_claim_skips_jobs_not_yet_due_and_takes_higher_priority_first():
    later = jobs.enqueue("test.echo", run_at=timezone.now() + dt.timedelta(hours=1))
    low = jobs.enqueue("test.echo", priority=0)
    high = jobs.enqueue("test.echo", priority=9)
    claimed = transitions.claim(WORKER, limit=10, lease_seconds=30)
    assert [c.fence.job_id for c in claimed] == [high.pk, low.pk]  # in claim order
    assert Job.objects.get(pk=later.pk).state == JobState.QUEUED
    assert transitions.claim(WORKER, limit=1, lease_seconds=30) == []


def test_priority_decides_which_job_a_single_claim_takes():
    jobs.enqueue("test.echo", priority=0)
    high = jobs.enqueue("test.echo", priority=9)
    assert claim_one().fence.job_id == high.pk


def test_claim_can_be_limited_to_queues():
    jobs.enqueue("test.echo", queue="mail")
    render = jobs.enqueue("test.echo", queue="render")
    claimed = transitions.claim(WORKER, limit=5, lease_seconds=30, queues=["render"])
    assert [c.fence.job_id for c in claimed] == [render.pk]


def test_rows_inserted_without_enqueue_are_claimed_too():
    created = Job.objects.create(kind="test.echo", payload={"via": "create"})
    bulk = Job.objects.bulk_create([Job(kind="test.echo", payload={"via": "bulk"})])[0]
    with connection.cursor() as cur:
        cur.execute("INSERT INTO jobs_job (kind, payload) VALUES ('test.echo', '{}') RETURNING id")
        raw_id = cur.fetchone()[0]
    claimed = transitions.claim(WORKER, limit=10, lease_seconds=30)
    assert {c.fence.job_id for c in claimed} == {created.pk, bulk.pk, raw_id}


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="a PostgreSQL plan")
def test_the_claim_query_walks_the_partial_index():
    Job.objects.bulk_create(
        [Job(kind="test.echo", state="succeeded", finished_at=timezone.now()) for _ in range(3000)]
    )
    Job.objects.bulk_create([Job(kind="test.echo") for _ in range(20)])
    with connection.cursor() as cur:
        cur.execute("ANALYZE jobs_job")
    captured = []

    def capture(execute, sql, params, many, context):
        if "FOR UPDATE SKIP LOCKED" in sql:
            captured.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        claim_one()
    sql, params = captured[0]
    with connection.cursor() as cur:
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    # The pick is jobs_pick's (migration 0018), whose own plan walks jobs_job_pick_idx in order
    # whatever the statistics say: tests/integration/test_steady_claim_plan.py reads it.
    assert "Function Scan on jobs_pick" in plan, plan
    assert "Seq Scan on jobs_job" not in plan, plan


# -- every fenced write rejects a stale attempt and records it -------------------------------------


def stale_fence(make_job) -> tuple[Job, Fence]:
    """A job now on attempt 2 and the fence attempt 1 still carries (its attempt row expired, as
    the reclaim left it: a write keyed by the attempt row alone would still find it)."""
    job = make_job(state=JobState.RUNNING, attempt=2, worker="host-b:202")
    Attempt.objects.create(
        job=job, number=1, worker=WORKER, claimed_at=job.created_at, outcome=AttemptOutcome.EXPIRED
    )
    return job, Fence(job.pk, 1, WORKER)


# Each worker write of the job row: the rejection it is recorded as, and the call. A release
# (a batch-mate handed back) and the confirmation that a handler runs are fenced writes too: a
# zombie's release would requeue the new attempt's running job under it.
WRITES = {
    "heartbeat": (Write.HEARTBEAT, lambda f: transitions.heartbeat(f, 30)),
    "checkpoint": (Write.CHECKPOINT, lambda f: transitions.checkpoint(f, {"step": 9}, 30)),
    "commit": (
        Write.COMMIT,
        lambda f: transitions.commit(f, {"zombie": True}, "jobs/x/attempt-1/out"),
    ),
    "fail": (Write.FAIL, lambda f: transitions.fail(f, "zombie failure", None)),
    "release": (Write.RELEASE, transitions.release),
    "confirm_running": (Write.HEARTBEAT, transitions.confirm_running),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_stale_write_changes_nothing_and_is_recorded(make_job, write):
    job, fence = stale_fence(make_job)
    before = Job.objects.values().get(pk=job.pk)
    attempts_before = list(Attempt.objects.filter(job=job).values())
    recorded_as, call = WRITES[write]
    with pytest.raises(jobs.LeaseLost):
        call(fence)
    after = Job.objects.values().get(pk=job.pk)
    assert after == before
    assert list(Attempt.objects.filter(job=job).values()) == attempts_before
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        recorded_as,
        1,
        2,
    )
    assert (rejected.worker, rejected.state_current) == (WORKER, JobState.RUNNING)


@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_presented_by_the_current_attempt_lands(make_job, write):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER)
    WRITES[write][1](Fence(job.pk, 1, WORKER))
    assert not RejectedWrite.objects.exists()


def test_a_stale_write_is_logged_on_one_line_with_both_attempts(make_job, caplog):
    job, fence = stale_fence(make_job)
    with pytest.raises(jobs.LeaseLost):
        transitions.commit(fence, None)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "jobs.fencing"]
    assert f"job={job.pk}" in line and "attempt_presented=1" in line
    assert "attempt_current=2" in line and WORKER in line and "commit" in line


def test_commit_records_result_and_closes_the_attempt(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER)
    transitions.commit(Fence(job.pk, 1, WORKER), {"rows": 3}, "jobs/1/attempt-1/out.csv")
    job.refresh_from_db()
    assert (job.state, job.result, job.result_ref) == (
        "succeeded",
        {"rows": 3},
        "jobs/1/attempt-1/out.csv",
    )
    assert job.finished_at is not None and job.lease_expires_at is None
    assert Attempt.objects.get(job=job).outcome == AttemptOutcome.SUCCEEDED


def test_a_commit_re_presented_after_it_landed_changes_nothing_and_is_no_stale_write(make_job):
    """The runner re-presents a commit whose outcome it could not learn: its own landed write."""
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER)
    transitions.commit(Fence(job.pk, 1, WORKER), 1)
    transitions.commit(Fence(job.pk, 1, WORKER), 1)
    assert Job.objects.get(pk=job.pk).result == 1
    assert not RejectedWrite.objects.exists()


def test_a_failure_presented_after_the_same_attempt_committed_is_rejected(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER)
    transitions.commit(Fence(job.pk, 1, WORKER), 1)
    with pytest.raises(jobs.LeaseLost):
        transitions.fail(Fence(job.pk, 1, WORKER), "late", None)
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


def test_a_stale_failure_never_overwrites_a_newer_terminal_state(make_job):
    job = make_job(state=JobState.RUNNING, attempt=3, worker="host-b:202")
    transitions.fail(Fence(job.pk, 3, "host-b:202"), "final failure", None)
    with pytest.raises(jobs.LeaseLost):
        transitions.fail(Fence(job.pk, 2, WORKER), "late failure of attempt 2", 5.0)
    job.refresh_from_db()
    assert (job.state, job.attempt, job.error) == (JobState.FAILED, 3, "final failure")


def test_a_failure_with_retry_requeues_later(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER)
    before = db_now()
    transitions.fail(Fence(job.pk, 1, WORKER), "boom", 30.0)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.run_at >= before + dt.timedelta(seconds=30)
    assert Attempt.objects.get(job=job).outcome == AttemptOutcome.FAILED


def test_a_handed_back_job_keeps_its_place_before_later_jobs_of_its_priority():
    first = jobs.enqueue("test.echo", priority=3)
    handed_back = claim_one()
    assert handed_back.fence.job_id == first.pk
    due = Job.objects.get(pk=first.pk).run_at
    later = [jobs.enqueue("test.echo", priority=3) for _ in range(2)]
    assert all(job.run_at > due for job in later)

    transitions.release(handed_back.fence)

    job = Job.objects.get(pk=first.pk)
    assert (job.state, job.priority, job.run_at) == (JobState.QUEUED, 3, due)
    again = claim_one()
    assert (again.fence.job_id, again.fence.attempt) == (first.pk, 2)


def test_a_late_commit_before_any_reclaim_is_accepted(make_job):
    """Design choice: an expired lease nobody reclaimed still belongs to its attempt."""
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-5, worker=WORKER)
    transitions.commit(Fence(job.pk, 1, WORKER), "late but alone")
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


# -- the reaper ---------------------------------------------------------------------------------


def reclaim(row, worker):
    return transitions.reclaim_expired(row, terminal=False, charged=True, worker=worker)


def test_reaper_reclaims_only_expired_leases(make_job):
    expired = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1)
    live = make_job(state=JobState.RUNNING, attempt=1, lease_in=60)
    assert reaper.reap("reaper:1") == 1
    expired.refresh_from_db()
    live.refresh_from_db()
    assert (expired.state, expired.attempt, expired.lease_expires_at) == ("queued", 1, None)
    assert live.state == JobState.RUNNING
    assert Attempt.objects.get(job=expired).outcome == AttemptOutcome.EXPIRED
    assert Attempt.objects.get(job=live).outcome == AttemptOutcome.RUNNING


def test_reaper_fails_a_job_whose_last_attempt_expired(make_job):
    job = make_job(
        state=JobState.RUNNING, attempt=2, lease_in=-1, max_attempts=2, worker="host-z:909"
    )
    reaper.reap("reaper:1")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "expired" in job.error
    # The operator reads which attempt ran where and stopped heartbeating (docs/design.md).
    assert "attempt 2 " in job.error and "ran on host-z:909" in job.error
    assert "stopped heartbeating" in job.error
    assert transitions.claim(WORKER, lease_seconds=30) == []


def test_reaper_uses_the_handlers_max_attempts_when_the_job_has_none(make_job):
    job = make_job(kind="test.fail", state=JobState.RUNNING, attempt=2, lease_in=-1)
    reaper.reap("reaper:1")
    assert Job.objects.get(pk=job.pk).state == JobState.FAILED  # test.fail allows 2


def test_reclaim_never_clobbers_a_commit_that_landed_after_the_reapers_read(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker=WORKER)
    (seen,) = transitions.find_expired(10)
    transitions.commit(Fence(job.pk, 1, WORKER), "landed first")
    assert not reclaim(seen, worker="reaper:1")
    job.refresh_from_db()
    assert (job.state, job.result) == (JobState.SUCCEEDED, "landed first")
    assert not RejectedWrite.objects.exists()  # a reaper's lost race is no stale write


def test_the_reapers_lost_races_are_counted_apart_from_stale_writes(make_job, monkeypatch):
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker=WORKER)
    seen = transitions.find_expired(10)
    transitions.commit(Fence(job.pk, 1, WORKER), "landed first")
    monkeypatch.setattr(reaper.transitions, "find_expired", lambda limit: seen)
    before = reaper.stats.lost_races
    assert reaper.reap("reaper:1") == 0
    assert reaper.stats.lost_races == before + 1
    assert not RejectedWrite.objects.exists()


def test_reclaim_never_touches_a_fresh_attempt_claimed_after_the_reapers_read(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker=WORKER)
    (seen,) = transitions.find_expired(10)
    assert reclaim(seen, worker="reaper:2")
    fresh = claim_one(worker="host-c:303")
    assert not reclaim(seen, worker="reaper:1")
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RUNNING, fresh.fence.attempt)


def test_reclaim_never_touches_a_later_attempt_whose_lease_ran_out_too(make_job):
    # The lease guard alone does not fence a stale read: the fresh attempt's lease can run out
    # as well, and the reaper's decision (here: retries remain) was made for attempt 1.
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker=WORKER, max_attempts=2)
    (seen,) = transitions.find_expired(10)
    assert reclaim(seen, worker="reaper:2")
    fresh = claim_one(worker="host-c:303")
    with connection.cursor() as cur:  # attempt 2's lease runs out too (the database clock)
        cur.execute(
            f"UPDATE jobs_job SET lease_expires_at = {driver_for(connection.vendor).later('s')} "
            "WHERE id = %(id)s",
            {"s": -1.0, "id": job.pk},
        )
    assert not reclaim(seen, worker="reaper:1")  # attempt 2 of 2: not queued for a third
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RUNNING, fresh.fence.attempt)
    assert not JobEvent.objects.filter(job_id=job.pk, type="expired", attempt=2).exists()


def test_queryset_states_read_the_database_clock(make_job):
    expired = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1)
    make_job(state=JobState.RUNNING, attempt=1, lease_in=60)
    due = jobs.enqueue("test.echo")
    jobs.enqueue("test.echo", run_at=timezone.now() + dt.timedelta(hours=1))
    done = make_job(state=JobState.SUCCEEDED)
    assert list(Job.objects.expired_leases()) == [expired]
    assert list(Job.objects.due()) == [Job.objects.get(pk=due.pk)]
    assert Job.objects.running().count() == 2 and Job.objects.queued().count() == 2
    assert list(Job.objects.terminal()) == [done]
