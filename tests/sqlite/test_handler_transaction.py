"""ctx.checkpoint()/ctx.heartbeat() inside the handler's own transaction, on SQLite.

SQLite has one writer, and an open handler transaction holds it: a fenced write on another
connection (what PostgreSQL gets) waited for the handler's COMMIT, which waited for the write --
30 s of busy timeout, then "database is locked" and a failed attempt, on every retry. Here the
write joins the handler's transaction, and a rejection is still recorded after a rollback.
"""

import pytest
from django.db import transaction

import jobs
from demo.models import Report
from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import runner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_a_checkpoint_inside_the_handlers_transaction_lands_on_sqlite(swap_handler):
    def checkpoint_in_atomic(ctx):
        with transaction.atomic():
            Job.objects.filter(pk=ctx.job_id).exists()  # the handler's own work
            ctx.checkpoint({"step": 1})
            ctx.heartbeat()
        return "done"

    swap_handler("test.echo", checkpoint_in_atomic)
    job = jobs.enqueue("test.echo")
    runner.drain()
    job.refresh_from_db()
    assert (job.state, job.attempt, job.result, job.progress) == (
        JobState.SUCCEEDED,
        1,
        "done",
        {"step": 1},
    )


def test_a_checkpoint_joins_the_fate_of_the_handlers_transaction_on_sqlite(swap_handler):
    def checkpoint_then_roll_back(ctx):
        with transaction.atomic():
            ctx.checkpoint({"step": 1})
            raise RuntimeError("the handler's own work failed")

    swap_handler("test.echo", checkpoint_then_roll_back)
    job = jobs.enqueue("test.echo", max_attempts=1)
    runner.drain()
    job.refresh_from_db()
    assert (job.state, job.progress) == (JobState.FAILED, None)
    assert "the handler's own work failed" in job.error


def test_a_rejection_met_inside_the_handlers_transaction_is_still_recorded_on_sqlite(
    swap_handler,
):
    def lose_the_job_then_checkpoint_in_atomic(ctx):
        # Another worker's attempt 2 took the job (a reclaim and a claim, committed).
        Job.objects.filter(pk=ctx.job_id).update(attempt=2)
        with transaction.atomic():
            ctx.checkpoint({"step": 1})  # raises LeaseLost: the atomic block rolls back

    swap_handler("test.echo", lose_the_job_then_checkpoint_in_atomic)
    job = jobs.enqueue("test.echo")
    runner.drain()
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        "checkpoint",
        1,
        2,
    )
    assert Attempt.objects.get(job=job, number=1).outcome == AttemptOutcome.LOST
    assert Job.objects.get(pk=job.pk).progress is None


def test_a_token_write_refused_inside_the_handlers_transaction_is_recorded_on_sqlite(
    swap_handler,
):
    report = Report.objects.create(name="in a transaction", body="before")

    def lose_the_job_then_write_in_atomic(ctx):
        Job.objects.filter(pk=ctx.job_id).update(attempt=2)  # attempt 2 took the job
        with transaction.atomic():
            ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie")

    swap_handler("test.echo", lose_the_job_then_write_in_atomic)
    job = jobs.enqueue("test.echo")
    runner.drain()
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_current, rejected.resource) == (
        "token_write",
        2,
        f"demo.Report:{report.pk}",
    )
    assert Attempt.objects.get(job=job, number=1).outcome == AttemptOutcome.LOST
    report.refresh_from_db()
    assert report.body == "before"


def test_a_mail_sent_inside_the_handlers_transaction_lands_on_sqlite(swap_handler, mailoutbox):
    # send_mail's ledger mark goes where the ledger's other writes go: on SQLite, into the
    # handler's transaction (on PostgreSQL, a connection of its own: test_mail_in_transaction).
    from jobs.effects import send_mail
    from jobs.models import IdempotencyKey

    def mail_in_atomic(ctx):
        with transaction.atomic():
            send_mail(ctx, "notice", "Ready", "Your file", ["a@b.c"])
        return "done"

    swap_handler("test.echo", mail_in_atomic)
    job = jobs.enqueue("test.echo")
    runner.drain()
    job.refresh_from_db()
    assert (job.state, len(mailoutbox)) == (JobState.SUCCEEDED, 1)
    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.status, row.kind, row.performs) == ("done", "mail", 1)
