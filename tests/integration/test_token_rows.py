"""Token-checked INSERTs and DELETEs (`ctx.fenced_create`, `ctx.fenced_bulk_create`,
`ctx.fenced_delete`): the job's current attempt decides in the statement that writes, all or
nothing; a refusal changes nothing, is recorded and raises LeaseLost.

Every step is the real fenced statement; only the workers are this test process. Run on
PostgreSQL here and on SQLite by tests/sqlite/test_token_rows.py (the same functions). The
COMMIT's second check and a zombie racing on a second connection:
tests/integration/test_fenced_rows.py.
"""

import pytest
from django.db import IntegrityError, connection, transaction

import jobs
from demo.models import Report
from jobs.context import close_side_connection
from jobs.effects import fenced
from jobs.models import Job, RejectedWrite
from jobs.worker import completer
from tests.integration.attempts import claim
from tests.integration.test_token_writes import J1, only, zombie_and_winner

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_current_attempt_creates_a_row_carrying_its_token():
    job = jobs.enqueue("test.echo")
    running = claim(J1)
    report = running.ctx.fenced_create(Report, name="daily", body="mine")
    assert report.pk is not None and report.updated_at is not None  # Django's pre_save ran
    stored = Report.objects.get(pk=report.pk)
    assert (stored.body, stored.rows, stored.fence_job_id, stored.fence_attempt) == (
        "mine",
        0,  # the field's default
        job.pk,
        1,
    )
    assert not RejectedWrite.objects.exists() and not running.held.lost.is_set()


def test_a_zombies_create_inserts_nothing_and_is_recorded():
    job, zombie, winner = zombie_and_winner()
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_create(Report, name="daily", body="zombie")
    assert not Report.objects.exists()
    rejected = only(job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        "token_write",
        1,
        2,
    )
    assert rejected.resource == "demo.Report:insert"
    assert zombie.held.lost.is_set()
    assert winner.ctx.fenced_create(Report, name="daily", body="winner").fence_attempt == 2


def test_a_duplicate_is_the_applications_integrity_error_not_a_refusal():
    jobs.enqueue("test.echo")
    running = claim(J1)
    Report.objects.create(name="taken")
    with pytest.raises(IntegrityError):
        running.ctx.fenced_create(Report, name="taken")
    assert not running.held.lost.is_set() and not RejectedWrite.objects.exists()
    assert running.ctx.fenced_create(Report, name="free").name == "free"  # still the owner


def test_a_zombies_duplicate_is_refused_before_any_constraint():
    job, zombie, _ = zombie_and_winner()
    Report.objects.create(name="taken")
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_create(Report, name="taken")
    assert only(job).resource == "demo.Report:insert"


def test_a_bulk_create_is_all_or_nothing():
    job, zombie, winner = zombie_and_winner()
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_bulk_create(Report, [{"name": "a"}, {"name": "b"}])
    assert not Report.objects.exists()
    made = winner.ctx.fenced_bulk_create(Report, [{"name": "a"}, {"name": "b", "rows": 3}])
    assert [(r.name, r.rows, r.fence_attempt) for r in made] == [("a", 0, 2), ("b", 3, 2)]
    assert Report.objects.count() == 2
    with pytest.raises(IntegrityError):  # the second duplicates "a": the first goes too
        winner.ctx.fenced_bulk_create(Report, [{"name": "c"}, {"name": "a"}])
    assert set(Report.objects.values_list("name", flat=True)) == {"a", "b"}
    assert only(job).write == "token_write"


def test_a_bulk_create_over_the_bound_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(fenced, "MAX_ROWS", 2)
    jobs.enqueue("test.echo")
    running = claim(J1)
    with pytest.raises(jobs.InvalidOption, match="more than 2 rows"):
        running.ctx.fenced_bulk_create(Report, [{"name": str(i)} for i in range(3)])
    assert not Report.objects.exists() and not running.held.lost.is_set()


def test_the_fence_columns_and_models_without_the_mixin_are_refused():
    jobs.enqueue("test.echo")
    running = claim(J1)
    with pytest.raises(jobs.InvalidOption, match="fence columns"):
        running.ctx.fenced_create(Report, name="x", fence_attempt=9)
    with pytest.raises(jobs.InvalidOption, match="FencedRow"):
        running.ctx.fenced_create(Job, kind="x")
    with pytest.raises(jobs.InvalidOption, match="FencedRow"):
        running.ctx.fenced_delete(Job.objects.all())
    assert not Report.objects.exists()


def test_the_current_attempt_deletes_its_rows():
    job = jobs.enqueue("test.echo")
    running = claim(J1)
    Report.objects.create(name="a")
    Report.objects.create(name="b", fence_job_id=job.pk + 1000, fence_attempt=7)  # another job's
    Report.objects.create(name="keep")
    assert running.ctx.fenced_delete(Report.objects.filter(name__in=["a", "b"])) == 2
    assert list(Report.objects.values_list("name", flat=True)) == ["keep"]
    assert running.ctx.fenced_delete(Report.objects.none()) == 0
    assert not RejectedWrite.objects.exists()


def test_a_zombies_delete_removes_nothing_and_is_recorded():
    job, zombie, winner = zombie_and_winner()
    a = Report.objects.create(name="a")
    winner.ctx.fenced_write(Report.objects.filter(pk=a.pk), body="winner")
    b = Report.objects.create(name="b")
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_delete(Report.objects.all())
    assert Report.objects.count() == 2
    rejected = only(job)
    assert (rejected.attempt_presented, rejected.attempt_current) == (1, 2)
    assert rejected.resource == f"demo.Report:delete {a.pk},{b.pk}"
    assert zombie.held.lost.is_set()


def test_a_zombies_empty_delete_is_refused_too():
    job, zombie, _ = zombie_and_winner()
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_delete(Report.objects.none())
    assert only(job).write == "token_write"


def test_a_row_a_higher_attempt_wrote_is_not_deleted_and_keeps_the_others():
    # The job is current, but one row carries a higher attempt of it (planted): that row is
    # refused, and the row the same DELETE removed is restored with it.
    job = jobs.enqueue("test.echo")
    running = claim(J1)
    Report.objects.create(name="ok")
    Report.objects.create(name="higher", fence_job_id=job.pk, fence_attempt=5)
    with pytest.raises(jobs.LeaseLost):
        running.ctx.fenced_delete(Report.objects.all())
    assert set(Report.objects.values_list("name", flat=True)) == {"ok", "higher"}


def test_a_multi_table_child_is_deleted_with_its_parent_row_but_not_created():
    from tests.app.models import ChildReport

    jobs.enqueue("test.echo")
    running = claim(J1)
    ChildReport.objects.create(name="child")
    with pytest.raises(jobs.InvalidOption, match="multi-table child"):
        running.ctx.fenced_create(ChildReport, name="other")
    assert running.ctx.fenced_delete(ChildReport.objects.all()) == 1
    assert not Report.objects.exists()


def _in_handlers_transaction(running, write) -> None:
    """`write` refused inside the handler's own transaction: LeaseLost at the statement."""
    try:
        with pytest.raises(jobs.LeaseLost), transaction.atomic():
            write()
    finally:
        close_side_connection()  # PostgreSQL recorded it on the context's side connection
    if connection.vendor == "sqlite":  # recorded by the completer once the handler is over
        completer.discard(running.claimed.fence)


@pytest.mark.parametrize("write", ["create", "delete"])
def test_inside_the_handlers_transaction_a_zombie_is_refused_at_its_statement(write):
    job, zombie, _ = zombie_and_winner()
    kept = Report.objects.create(name="kept")
    if write == "create":
        _in_handlers_transaction(zombie, lambda: zombie.ctx.fenced_create(Report, name="z"))
    else:
        rows = Report.objects.filter(pk=kept.pk)
        _in_handlers_transaction(zombie, lambda: zombie.ctx.fenced_delete(rows))
    assert list(Report.objects.values_list("name", flat=True)) == ["kept"]
    assert only(job).resource.startswith(
        f"demo.Report:{'insert' if write == 'create' else 'delete'}"
    )


def test_inside_the_handlers_transaction_the_owner_creates_and_deletes():
    _, _, winner = zombie_and_winner()
    kept = Report.objects.create(name="kept")
    with transaction.atomic():
        winner.ctx.fenced_create(Report, name="winner's")
        assert winner.ctx.fenced_delete(Report.objects.filter(pk=kept.pk)) == 1
    assert list(Report.objects.values_list("name", flat=True)) == ["winner's"]
    assert not RejectedWrite.objects.exists()
