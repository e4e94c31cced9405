"""What the tables say happened is what happened: attempt outcomes kept, rejections that survive
the handler's transaction, bounded enqueue under REPEATABLE READ and SERIALIZABLE, a heartbeat
that survives."""

import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction

import jobs
from jobs.core import transitions
from jobs.core.states import AttemptOutcome, JobState
from jobs.core.transitions import Fence, fence
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import completer, reaper, runner
from jobs.worker import heartbeat as heartbeat_module
from jobs.worker.heartbeat import Heartbeater
from tests.acceptance.cluster import wait_until

WORKER = "host-a:1"


@pytest.mark.django_db
def test_an_attempt_keeps_its_first_outcome_when_its_zombie_commits_later(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-1, worker=WORKER)
    reaper.reap("reaper:1")
    expired = Attempt.objects.get(job=job, number=1)
    transitions.claim("host-b:2", lease_seconds=30)
    with pytest.raises(jobs.LeaseLost):
        transitions.commit(Fence(job.pk, 1, WORKER), "zombie")
    after = Attempt.objects.get(job=job, number=1)
    # "expired at T1, its commit rejected at T2": both times kept, neither overwritten.
    assert (after.outcome, after.ended_at) == (AttemptOutcome.EXPIRED, expired.ended_at)
    rejected = RejectedWrite.objects.get(job=job)
    assert rejected.write == "commit" and rejected.at > expired.ended_at


# README: "heartbeat() and checkpoint() never join the handler's own transaction".
FENCED_WRITES = {
    "heartbeat": lambda ctx: ctx.heartbeat(),
    "checkpoint": lambda ctx: ctx.checkpoint({"step": 1}),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_a_fenced_write_inside_the_handlers_transaction_neither_holds_the_job_row_nor_joins_it(
    write, swap_handler, second_connection
):
    seen = {}
    row_sql = "SELECT heartbeat_at, progress FROM jobs_job WHERE id = %s"

    def write_in_atomic(ctx):
        before = second_connection.execute(row_sql, [ctx.job_id]).fetchone()
        with transaction.atomic():
            FENCED_WRITES[write](ctx)
            # Another session (the drain's heartbeat, the reaper) can still lock the job row.
            with second_connection.transaction():
                second_connection.execute("SET LOCAL lock_timeout = '2s'")
                after = second_connection.execute(row_sql + " FOR UPDATE", [ctx.job_id]).fetchone()
        seen["before"], seen["after"] = before, after
        return "done"

    swap_handler("test.echo", write_in_atomic)
    job = jobs.enqueue("test.echo")
    runner.drain()
    # Committed on its own, before the handler's COMMIT: another session already sees it.
    assert seen["after"][0] > seen["before"][0]
    if write == "checkpoint":
        assert seen["after"][1] == {"step": 1}
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", list(FENCED_WRITES))
def test_a_rejection_seen_inside_the_handlers_transaction_is_still_recorded(
    write, swap_handler, second_connection
):
    def lose_the_job_then_write_in_atomic(ctx):
        second_connection.execute("UPDATE jobs_job SET attempt = 2 WHERE id = %s", [ctx.job_id])
        with transaction.atomic():
            FENCED_WRITES[write](ctx)  # raises LeaseLost: the atomic block rolls back

    swap_handler("test.echo", lose_the_job_then_write_in_atomic)
    job = jobs.enqueue("test.echo")
    runner.drain()
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        write,
        1,
        2,
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(30)
@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_enqueue_with_a_unique_key_hidden_by_the_snapshot_is_a_clear_error(
    level, second_connection
):
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            cur.execute("SELECT count(*) FROM jobs_job")  # the snapshot is taken here
        second_connection.execute(
            "INSERT INTO jobs_job (kind, unique_key) VALUES ('test.echo', 'order-1')"
        )
        with pytest.raises(jobs.DuplicateJob, match=level):
            jobs.enqueue("test.echo", unique_key="order-1")
    assert Job.objects.filter(unique_key="order-1").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_survives_any_exception_and_beats_again(make_job, monkeypatch):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER, lease_in=30)
    real = transitions.heartbeat_many
    calls = []

    def fail_twice(fences, confirm=None):
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("not a database error")
        return real(fences, confirm)

    monkeypatch.setattr(heartbeat_module.transitions, "heartbeat_many", fail_twice)
    before = Job.objects.get(pk=job.pk).lease_expires_at
    with Heartbeater(interval=0.05, commit=completer.commit) as beats:
        beats.hold(Fence(job.pk, 1, WORKER), 30)
        wait_until(
            lambda: Job.objects.get(pk=job.pk).lease_expires_at > before,
            timeout=10,
            what="a beat after two failures",
            job_id=job.pk,
        )
    assert len(calls) >= 3


@pytest.mark.django_db(transaction=True)
def test_leases_unbeaten_for_half_their_length_are_at_risk_and_the_runner_knows(
    make_job, monkeypatch
):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER, lease_in=30)

    def database_gone(fences, confirm=None):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(heartbeat_module.transitions, "heartbeat_many", database_gone)
    with Heartbeater(interval=0.05, commit=completer.commit) as beats:
        beats.hold(Fence(job.pk, 1, WORKER), 1.0)
        assert not beats.at_risk
        started = time.monotonic()
        wait_until(lambda: beats.at_risk, timeout=5, what="at risk", job_id=job.pk)
        assert time.monotonic() - started >= 0.4


def test_the_fence_guard_uses_only_public_django_api():
    source = Path(fence.__file__).read_text()  # where the fenced statement's transaction lives
    assert "_from_testcase" not in source and "atomic(durable=True)" in source


@pytest.mark.django_db(transaction=True)
def test_a_fenced_write_inside_a_callers_transaction_is_refused(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER)
    with transaction.atomic(), pytest.raises(RuntimeError, match="durable"):
        transitions.commit(Fence(job.pk, 1, WORKER), "inside")
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
