"""A token-checked delete whose rows other tables refer to (PostgreSQL): the collector's cascades
go with the delete, and only the delete itself is checked again at the COMMIT."""

import pytest
from django.db import connection, transaction

import jobs
from demo.models import Report
from jobs.models import RejectedWrite
from tests.app.models import Note
from tests.integration.attempts import claim
from tests.integration.test_fenced_write import A, _taken_over_elsewhere

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_owners_delete_that_sets_a_fenced_rows_reference_to_null_commits():
    # The notes were written by a plain save (no token) and by a job long done: the SET_NULL the
    # delete cascades to them is the delete's, not a fenced write of theirs.
    jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="daily")
    Note.objects.create(report=report, text="plain")
    Note.objects.create(report=report, text="old job's", fence_job_id=10**9, fence_attempt=4)
    assert owner.ctx.fenced_delete(Report.objects.filter(pk=report.pk)) == 1
    assert not Report.objects.exists()
    assert sorted(Note.objects.values_list("text", "report")) == [
        ("old job's", None),
        ("plain", None),
    ]
    assert not RejectedWrite.objects.exists()


def test_the_owners_delete_with_a_set_null_inside_its_own_transaction_commits():
    jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="daily")
    Note.objects.create(report=report, text="plain")
    with transaction.atomic():
        assert owner.ctx.fenced_delete(Report.objects.filter(pk=report.pk)) == 1
    assert list(Note.objects.values_list("report", flat=True)) == [None]


def test_a_zombies_delete_with_a_set_null_is_still_refused_at_commit():
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    report = Report.objects.create(name="daily")
    Note.objects.create(report=report, text="plain")
    with pytest.raises(Exception) as refused:
        with transaction.atomic():
            zombie.ctx.fenced_delete(Report.objects.filter(pk=report.pk))
            _taken_over_elsewhere(job.pk)
    assert "jobs_fence_at_commit" in str(refused.value)
    assert Report.objects.filter(pk=report.pk).exists()
    assert list(Note.objects.values_list("report", flat=True)) == [report.pk]


def test_a_loop_of_deletes_in_one_transaction_names_its_deleter_once():
    # The COMMIT checks every deleter for every deleted row: one name per call of a loop made a
    # transaction of n one-row deletes check n * n times (1,500 deletes: a 12 s COMMIT, its job
    # row share-locked, against 0.03 s).
    job = jobs.enqueue("test.echo")
    owner = claim(A)
    reports = [Report.objects.create(name=f"r{i}") for i in range(3)]
    with transaction.atomic(), connection.cursor() as cur:
        for report in reports:
            assert owner.ctx.fenced_delete(Report.objects.filter(pk=report.pk)) == 1
        cur.execute("SELECT current_setting('palisade.fenced_deleters')")
        assert cur.fetchone() == (f"{job.pk}:1",)
    assert not Report.objects.exists()
