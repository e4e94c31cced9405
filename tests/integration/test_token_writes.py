"""A token-checked write (`ctx.fenced_write`) checks the token that matters: the job's current
attempt, in the statement that writes, beside the row's own token -- and is all or nothing.

Every step is the real fenced statement; only the workers are this test process. Run on
PostgreSQL here and on SQLite by tests/sqlite/test_token_writes.py (the same functions).
"""

from collections.abc import Callable

import pytest
from django.db import connection, transaction

import jobs
from demo.models import Report
from jobs.context import close_side_connection
from jobs.core import transitions
from jobs.core.sql import driver_for
from jobs.core.states import JobState
from jobs.effects import fenced
from jobs.models import Job, RejectedWrite
from jobs.ops import metrics
from jobs.worker import completer, reaper
from tests.integration.attempts import Running, claim

pytestmark = pytest.mark.django_db(transaction=True)

J1, J2, K1 = "host-a:1", "host-b:2", "host-c:3"


def expire_and_reap(job_id: int) -> None:
    """The lease runs out (moved into the past on the database clock) and the reaper reclaims."""
    clock = driver_for(connection.vendor)
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE jobs_job SET lease_expires_at = {clock.later('s')} WHERE id = %(id)s",
            {"s": -1.0, "id": job_id},
        )
    assert reaper.reap("reaper:1") == 1


def zombie_and_winner() -> tuple[Job, Running, Running]:
    """Job J: attempt 1 stalls past its lease (the zombie), attempt 2 takes over."""
    job = jobs.enqueue("test.echo")
    zombie = claim(J1)
    expire_and_reap(job.pk)
    winner = claim(J2)
    assert winner.claimed.fence.attempt == 2
    return job, zombie, winner


def only(job: Job) -> RejectedWrite:
    return RejectedWrite.objects.get(job=job)


def test_cross_job_aba_the_zombie_is_refused_after_another_job_wrote_the_row():
    job, zombie, winner = zombie_and_winner()
    report = Report.objects.create(name="aba")
    reports = Report.objects.filter(pk=report.pk)
    assert winner.ctx.fenced_write(reports, body="J attempt 2") == 1
    winner.commit({"ok": 2})
    other = jobs.enqueue("test.echo")
    k = claim(K1)
    assert k.claimed.fence.job_id == other.pk
    assert k.ctx.fenced_write(reports, body="K") == 1  # the row now forgets J's attempts
    k.commit({"ok": "k"})

    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_write(reports, body="J attempt 1, a zombie")

    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == ("K", other.pk, 1)
    rejected = only(job)
    assert (
        rejected.write,
        rejected.attempt_presented,
        rejected.attempt_current,
        rejected.state_current,
        rejected.resource,
    ) == ("token_write", 1, 2, JobState.SUCCEEDED, f"demo.Report:{report.pk}")
    assert zombie.held.lost.is_set()


def test_a_row_the_winner_never_wrote_is_refused_to_the_zombie_even_after_success():
    job, zombie, winner = zombie_and_winner()
    winner.commit({"ok": 2})
    report = Report.objects.create(name="untouched", body="before")

    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie")

    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == ("before", None, 0)
    assert (only(job).write, only(job).attempt_current) == ("token_write", 2)


def test_a_two_row_write_is_all_or_nothing_when_one_row_is_not_yet_the_winners():
    job, zombie, winner = zombie_and_winner()
    written = Report.objects.create(name="a")
    not_yet = Report.objects.create(name="b", body="before")
    assert winner.ctx.fenced_write(Report.objects.filter(pk=written.pk), body="winner") == 1

    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_write(Report.objects.filter(name__in=["a", "b"]), body="zombie")

    rows = dict(Report.objects.values_list("name", "body"))
    assert rows == {"a": "winner", "b": "before"}  # not one row of the zombie's
    assert only(job).resource == f"demo.Report:{written.pk},{not_yet.pk}"


def test_a_row_refused_on_its_own_token_rolls_back_the_rows_already_changed():
    # The job is current, but one row carries a higher attempt of it (planted): that row is
    # refused, and the row the same UPDATE accepted is rolled back with it.
    job = jobs.enqueue("test.echo")
    running = claim(J1)
    Report.objects.create(name="ok", body="before")
    Report.objects.create(name="higher", fence_job_id=job.pk, fence_attempt=5)

    with pytest.raises(jobs.LeaseLost):
        running.ctx.fenced_write(Report.objects.all(), body="attempt 1")

    assert dict(Report.objects.values_list("name", "body")) == {"ok": "before", "higher": ""}
    assert only(job).write == "token_write"


@pytest.mark.parametrize(
    ("take_back", "state"),
    [(transitions.cancel, JobState.CANCELLED), (transitions.requeue, JobState.QUEUED)],
)
def test_after_an_operator_took_a_running_job_back_its_handlers_write_is_refused(
    take_back: Callable[[int, str], transitions.OperatorResult], state: str
):
    job = jobs.enqueue("test.echo")
    running = claim(J1)
    report = Report.objects.create(name="taken back", body="before")
    assert take_back(job.pk, "ops@example.com").changed

    with pytest.raises(jobs.LeaseLost):
        running.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="too late")

    report.refresh_from_db()
    assert report.body == "before"
    rejected = only(job)
    assert (rejected.attempt_presented, rejected.attempt_current, rejected.state_current) == (
        1,
        1,
        state,
    )


def test_the_current_attempt_writes_and_may_retry_its_own_write():
    job = jobs.enqueue("test.echo")
    running = claim(J1)
    report = Report.objects.create(name="mine")
    reports = Report.objects.filter(pk=report.pk)
    assert running.ctx.fenced_write(reports, body="one") == 1
    assert running.ctx.fenced_write(reports, body="two") == 1
    assert running.ctx.fenced_write(Report.objects.none(), body="none") == 0
    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == ("two", job.pk, 1)
    assert not RejectedWrite.objects.exists()


def _token_writes_counted() -> float:
    for line in metrics.render().decode().splitlines():
        if line.startswith('jobs_stale_writes_rejected_total{write="token_write"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_refused_token_write_is_counted_with_the_stale_writes(monkeypatch):
    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)  # every row settles at once
    _, zombie, _ = zombie_and_winner()
    report = Report.objects.create(name="counted")
    before = _token_writes_counted()
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie")
    assert _token_writes_counted() == before + 1


def test_a_refusal_inside_the_handlers_transaction_is_still_recorded():
    job, zombie, _ = zombie_and_winner()
    report = Report.objects.create(name="in a transaction", body="before")
    try:
        with pytest.raises(jobs.LeaseLost), transaction.atomic():
            zombie.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie")
    finally:
        close_side_connection()  # PostgreSQL recorded it on the context's side connection
    zombie_done = zombie.held.lost.is_set()
    if connection.vendor == "sqlite":  # recorded by the completer once the handler is over
        completer.discard(zombie.claimed.fence)
    report.refresh_from_db()
    assert zombie_done and report.body == "before"
    assert (only(job).write, only(job).attempt_current) == ("token_write", 2)


def test_more_rows_than_the_bound_is_a_clear_error_and_writes_nothing(monkeypatch):
    monkeypatch.setattr(fenced, "MAX_ROWS", 2)
    jobs.enqueue("test.echo")
    running = claim(J1)
    Report.objects.bulk_create([Report(name=f"r{i}", body="before") for i in range(3)])
    with pytest.raises(jobs.InvalidOption, match="more than 2 rows"):
        running.ctx.fenced_write(Report.objects.all(), body="too many")
    assert set(Report.objects.values_list("body", flat=True)) == {"before"}
    assert not running.held.lost.is_set() and not RejectedWrite.objects.exists()
