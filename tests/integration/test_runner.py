"""The runner in this process against PostgreSQL: claim -> handler -> classify -> one write."""

import datetime as dt
from types import SimpleNamespace

import pytest
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

import jobs
from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import completer, runner
from tests.integration.test_queue_claims import jobs_in_claim_order

pytestmark = pytest.mark.django_db(transaction=True)


def test_drain_runs_due_jobs_and_commits_their_results():
    a = jobs.enqueue("test.echo", {"n": 1})
    b = jobs.enqueue("test.echo", {"n": 2})
    assert runner.drain() == 2
    for job, n in ((a, 1), (b, 2)):
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED
        assert job.result == {"echo": {"n": n}, "attempt": 1}
    assert Attempt.objects.get(job=a).worker == runner.worker_identity()


def test_a_drain_runs_its_jobs_in_claim_order_priority_then_due_time_then_id(monkeypatch):
    expected = jobs_in_claim_order()
    later = jobs.enqueue("test.echo", priority=10, run_at=timezone.now() + dt.timedelta(hours=1))
    ran: list[int] = []
    real = runner.execute

    def spy(handler, ctx):
        ran.append(ctx.job_id)
        return real(handler, ctx)

    monkeypatch.setattr(runner, "execute", spy)
    # In batches of 1, 2, then 4 (the drain's adaptive batch), and at one batch of eight.
    assert runner.drain() == 5
    assert ran == expected
    Job.objects.filter(pk__in=expected).update(state="queued", finished_at=None)
    ran.clear()
    monkeypatch.setattr(
        runner.policy, "next_claim_batch", lambda current, per_job, cap, claim_seconds=0.0: cap
    )
    with override_settings(JOBS={"CLAIM_BATCH": 8}):
        assert runner.drain() == 5
    assert ran == expected
    later.refresh_from_db()
    assert later.state == JobState.QUEUED  # not due: not run, whatever its priority


def test_drain_returns_zero_when_nothing_is_due():
    assert runner.drain() == 0


@override_settings(JOBS={"RETRY_BASE_SECONDS": 0.0})
def test_a_raising_handler_is_retried_then_failed():
    job = jobs.enqueue("test.fail")  # the handler allows 2 attempts
    runner.drain()
    runner.drain()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.FAILED, 2)
    assert "boom on attempt 2" in job.error
    outcomes = list(Attempt.objects.filter(job=job).values_list("outcome", flat=True))
    assert outcomes == [AttemptOutcome.FAILED, AttemptOutcome.FAILED]


def test_a_failure_schedules_the_retry_with_backoff():
    job = jobs.enqueue("test.fail")
    runner.drain()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.attempt == 1
    assert runner.drain() == 0  # not due yet: backoff of about RETRY_BASE_SECONDS


def test_a_job_of_an_unregistered_kind_fails_instead_of_running():
    job = Job.objects.create(kind="removed.kind", max_attempts=1)
    runner.drain()
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "removed.kind" in job.error


def test_a_result_that_is_not_json_fails_the_attempt(swap_handler):
    job = jobs.enqueue("test.echo", {"n": 1}, max_attempts=1)
    swap_handler("test.echo", lambda ctx: {1, 2, 3})
    runner.drain()
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "unusable result" in job.error


@pytest.mark.parametrize("bad", [{1, 2, 3}, float("nan"), "x" * (1 << 20)])
def test_a_result_that_cannot_be_stored_fails_at_once_not_retried(swap_handler, settings, bad):
    """The same handler would most likely return the same value: rerunning its work for it is
    what a PermanentFailure spares (a task's UnencodableResult is one; so is a plain handler's)."""
    settings.JOBS = {**settings.JOBS, "MAX_PAYLOAD_BYTES": 1 << 16}
    job = jobs.enqueue("test.echo", {"n": 1}, max_attempts=5)
    swap_handler("test.echo", lambda ctx: bad)
    runner.drain()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.FAILED, 1), job.error
    assert "unusable result" in job.error


def test_a_retry_waits_the_configured_backoff_capped_and_spread_by_its_jitter(
    settings, swap_handler, monkeypatch
):
    """RETRY_BASE_SECONDS * 2^(n-1), capped at RETRY_MAX_SECONDS, then up to a quarter more:
    the worker's own settings and a jitter drawn per failure (0.8 here: +20%)."""
    settings.JOBS = {**settings.JOBS, "RETRY_BASE_SECONDS": 10.0, "RETRY_MAX_SECONDS": 15.0}
    monkeypatch.setattr(completer, "random", SimpleNamespace(random=lambda: 0.8))
    job = jobs.enqueue("test.echo", max_attempts=5)

    def fails(ctx):
        raise RuntimeError("try again later")

    swap_handler("test.echo", fails)
    delays = []
    for number in (1, 2):
        runner.drain()
        job.refresh_from_db()
        ended = Attempt.objects.get(job=job, number=number).ended_at
        delays.append((job.run_at - ended).total_seconds())
        Job.objects.filter(pk=job.pk).update(run_at=Now())  # the wait skipped
    # 10 s, then 20 s capped to 15 s; each plus its 20%.
    assert delays == pytest.approx([12.0, 18.0], abs=0.05)


def test_a_handler_whose_lease_was_taken_discards_its_work(second_connection, swap_handler):
    """The handler's own checkpoint finds the lease gone: no commit is even attempted."""
    from tests.app.handlers import checkpointing

    job = jobs.enqueue("test.checkpointing", {"seconds_by_attempt": {"1": 30}})

    def steal_then_continue(ctx):
        # Another worker takes the job over (as a reclaim + claim would) mid-run.
        second_connection.execute(
            "UPDATE jobs_job SET attempt = attempt + 1 WHERE id = %s", [ctx.job_id]
        )
        return checkpointing(ctx)

    swap_handler("test.checkpointing", steal_then_continue)
    runner.drain()
    assert Attempt.objects.get(job=job, number=1).outcome == AttemptOutcome.LOST
    assert list(RejectedWrite.objects.filter(job=job).values_list("write", flat=True)) == [
        "checkpoint"
    ]


def test_a_handler_whose_token_write_was_refused_ends_its_attempt_lost(
    second_connection, swap_handler
):
    """A refused token write is recorded without ending the attempt (jobs.effects.fenced): the
    runner ends it `lost`, its work discarded -- not failed, not retried, the new attempt's job
    left as it is."""
    from demo.models import Report

    report = Report.objects.create(name="daily")
    job = jobs.enqueue("test.echo", max_attempts=5)

    def taken_over_then_writes(ctx):
        second_connection.execute(
            "UPDATE jobs_job SET attempt = attempt + 1 WHERE id = %s", [ctx.job_id]
        )
        ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie")
        return "never committed"

    swap_handler("test.echo", taken_over_then_writes)
    runner.drain()
    job.refresh_from_db()
    assert (job.state, job.attempt, job.error) == (JobState.RUNNING, 2, "")
    assert Attempt.objects.get(job=job, number=1).outcome == AttemptOutcome.LOST
    assert "token_write" in RejectedWrite.objects.filter(job=job).values_list("write", flat=True)
    report.refresh_from_db()
    assert report.body == ""
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING  # attempt 2's, untouched


class _Refused(jobs.PermanentFailure):
    def __str__(self) -> str:
        raise RuntimeError("a hostile __str__")


@override_settings(JOBS={"RETRY_BASE_SECONDS": 0.0})
def test_a_handler_that_raises_permanent_failure_fails_at_once_with_attempts_left(swap_handler):
    """A plain handler may raise jobs.PermanentFailure (as jobs.tasks does for a
    result that cannot be stored): its job fails on that attempt, not retried, even when the
    exception's own text cannot be read."""
    job = jobs.enqueue("test.echo", max_attempts=3)

    def refuse(ctx):
        raise _Refused()

    swap_handler("test.echo", refuse)
    runner.drain()
    runner.drain()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.FAILED, 1)
    assert "_Refused" in job.error
