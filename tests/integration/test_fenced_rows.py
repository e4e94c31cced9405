"""Token-checked INSERTs and DELETEs on PostgreSQL: the COMMIT of the transaction they ran in
decides again (jobs/core/sql/fenced.py), a zombie racing a takeover on a second connection
changes nothing, and a table whose check is an older version's (UPDATE only) is refused until
`migrate` installs this one. (The statement's own decision: test_token_rows.py.)"""

import dataclasses
import threading
import time

import pytest
from django.db import IntegrityError, connection, transaction

import jobs
from demo.models import Report
from jobs.core.registry import get_handler
from jobs.core.sql import fenced as fenced_sql
from jobs.effects import fenced, fenced_rows
from jobs.models import Job, RejectedWrite
from jobs.worker import runner
from tests.integration.attempts import claim
from tests.integration.test_fenced_write import (
    A,
    _blocked_on_a_lock,
    _decided_behind_a_takeover,
    _taken_over_elsewhere,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_create_whose_job_is_taken_over_before_its_transaction_commits_is_rolled_back():
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    with pytest.raises(IntegrityError) as refused:
        with transaction.atomic():
            zombie.ctx.fenced_create(Report, name="zombie's", body="stale")
            _taken_over_elsewhere(job.pk)
    assert fenced.refused_at_commit(refused.value) == "demo.Report"
    assert not Report.objects.exists()


def test_a_delete_whose_job_is_taken_over_before_its_transaction_commits_is_rolled_back():
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    Report.objects.create(name="a", body="before")
    Report.objects.create(name="b", fence_job_id=job.pk + 1000, fence_attempt=3)  # another job's
    with pytest.raises(IntegrityError) as refused:
        with transaction.atomic():
            assert zombie.ctx.fenced_delete(Report.objects.all()) == 2
            _taken_over_elsewhere(job.pk)
    assert fenced.refused_at_commit(refused.value) == "demo.Report"
    assert dict(Report.objects.values_list("name", "body")) == {"a": "before", "b": ""}


def test_the_owner_commits_its_creates_and_deletes_in_its_own_transaction():
    job = jobs.enqueue("test.echo")
    owner = claim(A)
    old = Report.objects.create(name="old")
    with transaction.atomic():
        owner.ctx.fenced_create(Report, name="new")
        owner.ctx.fenced_delete(Report.objects.filter(pk=old.pk))
        Report.objects.create(name="plain")  # not checked: no fence of its own
        Report.objects.filter(name="plain").delete()
    assert list(Report.objects.values_list("name", "fence_job_id")) == [("new", job.pk)]


def test_a_handler_whose_transaction_commit_refuses_its_delete_is_lost_and_recorded():
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    report = Report.objects.create(name="daily")

    def handler(ctx: jobs.JobContext) -> str:
        with transaction.atomic():
            ctx.fenced_delete(Report.objects.filter(pk=report.pk))
            _taken_over_elsewhere(ctx.job_id)
        return "never"

    fn = dataclasses.replace(get_handler("test.echo"), fn=handler)
    outcome = runner.execute(fn, zombie.ctx)
    assert (outcome.succeeded, outcome.lost, outcome.error) == (False, True, "")
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        "token_write",
        1,
        2,
    )
    assert Report.objects.filter(pk=report.pk).exists()


def test_a_marked_delete_with_no_deleter_named_is_refused_at_commit():
    # The COMMIT's check of a delete reads the deleter from the transaction's setting: a delete
    # marked as fenced without it has no fence to check, and is refused.
    report = Report.objects.create(name="a")
    with pytest.raises(IntegrityError) as refused:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(fenced_sql.MARK_DELETE)
            cur.execute("DELETE FROM demo_report WHERE id = %s", [report.pk])
    assert fenced.refused_at_commit(refused.value) == "demo.Report"
    assert Report.objects.filter(pk=report.pk).exists()


def test_a_zombie_racing_a_takeover_deletes_no_row(second_connection):
    # Attempt 1 still owns the job when its delete begins; on a second connection the job is
    # taken over (attempt 2), which writes the second row, uncommitted. The zombie's delete waits
    # on that row's lock and then deletes neither row.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    Report.objects.create(name="first")
    second = Report.objects.create(name="second")
    outcome: dict[str, object] = {}
    started = threading.Event()

    def zombie_deleter() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cur.fetchone()[0]
            started.set()
            outcome["decision"] = fenced_rows.delete(
                zombie.claimed.fence, Report.objects.order_by("-pk")
            )
        finally:
            connection.close()

    with second_connection.transaction():
        second_connection.execute("UPDATE jobs_job SET attempt = 2 WHERE id = %s", [job.pk])
        second_connection.execute(
            "UPDATE demo_report SET body = 'attempt 2', fence_job_id = %s, fence_attempt = 2 "
            "WHERE id = %s",
            [job.pk, second.pk],
        )
        thread = threading.Thread(target=zombie_deleter)
        thread.start()
        assert started.wait(5)
        deadline = time.monotonic() + 10
        while not _blocked_on_a_lock(int(outcome["pid"])):  # type: ignore[call-overload]
            assert time.monotonic() < deadline, "the zombie's delete never waited on the row lock"
            time.sleep(0.01)  # poll interval of a deadline-bound wait
    thread.join(10)
    decision = outcome["decision"]
    assert isinstance(decision, fenced.TokenDecision)
    assert decision.refused and decision.attempt_current == 2
    assert set(Report.objects.values_list("name", flat=True)) == {"first", "second"}


def test_a_zombie_waiting_on_a_row_whose_writer_took_the_job_over_deletes_nothing_at_once(
    second_connection,
):
    # As fenced_write's test of the same name: the row's writer takes the job over without
    # touching its token; the zombie's delete, inside its handler's transaction, waits for the
    # row, then is refused at its statement (rows locked first), not only at the COMMIT.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    report = Report.objects.create(name="daily")
    outcome = _decided_behind_a_takeover(
        second_connection,
        job.pk,
        report.pk,
        lambda: fenced_rows.delete(zombie.claimed.fence, Report.objects.filter(pk=report.pk)),
    )
    decision = outcome.get("decision")
    assert isinstance(decision, fenced.TokenDecision) and decision.refused, outcome
    assert decision.attempt_current == 2 and "commit" not in outcome
    assert Report.objects.filter(pk=report.pk, rows=5).exists()


def test_a_zombie_whose_job_is_taken_over_on_a_second_connection_inserts_nothing(
    second_connection,
):
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    second_connection.execute("UPDATE jobs_job SET attempt = 2 WHERE id = %s", [job.pk])
    second_connection.commit()
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_create(Report, name="zombie's")
    assert not Report.objects.exists()
    assert RejectedWrite.objects.get(job=job).attempt_current == 2


# The table as the previous release's `migrate` left it: 0023's UPDATE trigger, with its comment.
_OLD_RELEASE_TRIGGERS = (
    "DROP TRIGGER jobs_fence_at_commit_insert ON demo_report; "
    "DROP TRIGGER jobs_fence_at_commit_delete ON demo_report; "
    "DROP TRIGGER jobs_fence_at_commit ON demo_report; "
    "CREATE CONSTRAINT TRIGGER jobs_fence_at_commit AFTER UPDATE ON demo_report "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
    "WHEN (current_setting('palisade.fenced_write', true) = 'on') "
    "EXECUTE FUNCTION jobs_fence_at_commit('demo.Report'); "
    "COMMENT ON TRIGGER jobs_fence_at_commit ON demo_report IS 'palisade f2447d6bb449db0a'"
)


def test_upgrading_from_the_previous_release_keeps_its_trigger_and_lets_readers_read(
    second_connection,
):
    # The previous release's workers look for `jobs_fence_at_commit` by name and may still be
    # running: `migrate` adds the INSERT and DELETE checks beside it, never dropping it -- a DROP
    # would wait behind every open transaction that read the table, then stop all its readers.
    with connection.cursor() as cur:
        cur.execute(_OLD_RELEASE_TRIGGERS)
        cur.execute(
            "SELECT oid FROM pg_trigger WHERE tgname = 'jobs_fence_at_commit' "
            "AND tgrelid = 'demo_report'::regclass"
        )
        (before,) = cur.fetchone()
    second_connection.execute("SELECT count(*) FROM demo_report")  # a reader's open transaction
    try:
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = '5s'")
            try:
                installed = fenced.install_commit_checks()
            finally:
                cur.execute("RESET lock_timeout")
    finally:
        second_connection.rollback()
    assert "demo.Report" in installed and not fenced.commit_checks_missing()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT oid FROM pg_trigger WHERE tgname = 'jobs_fence_at_commit' "
            "AND tgrelid = 'demo_report'::regclass"
        )
        assert cur.fetchone() == (before,)


def test_a_table_whose_check_is_an_older_versions_is_refused_until_migrate(monkeypatch):
    # 0023's trigger fired AFTER UPDATE only: an INSERT or DELETE on it would go unchecked at
    # the COMMIT, so the write is refused until `migrate` installs this version's.
    monkeypatch.setattr(fenced, "_CHECKED", set())
    jobs.enqueue("test.echo")
    owner = claim(A)
    with connection.cursor() as cur:
        cur.execute(_OLD_RELEASE_TRIGGERS)
    try:
        with pytest.raises(jobs.InvalidOption, match="manage.py migrate"):
            owner.ctx.fenced_create(Report, name="unchecked")
        with pytest.raises(jobs.InvalidOption, match="manage.py migrate"):
            owner.ctx.fenced_delete(Report.objects.all())
        assert "demo.Report" in fenced.commit_checks_missing()
    finally:
        installed = fenced.install_commit_checks()  # what every migrate runs (jobs.apps)
    assert "demo.Report" in installed and not fenced.commit_checks_missing()
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tgname, tgtype FROM pg_trigger WHERE tgrelid = 'demo_report'::regclass "
            "AND tgname LIKE 'jobs_fence_at_commit%%'"
        )
        tgtypes = dict(cur.fetchall())
    # UPDATE, INSERT and DELETE, one trigger each
    assert {name: t & (4 | 8 | 16) for name, t in tgtypes.items()} == {
        "jobs_fence_at_commit": 16,
        "jobs_fence_at_commit_insert": 4,
        "jobs_fence_at_commit_delete": 8,
    }
    assert owner.ctx.fenced_create(Report, name="checked").fence_attempt == 1
    assert Job.objects.filter(state="running").count() == 1


def _function_source() -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT prosrc FROM pg_proc WHERE proname = 'jobs_fence_at_commit'")
        return str(cur.fetchone()[0])


def test_migration_0025_teaches_the_check_deletes_and_goes_back():
    from django.core.management import call_command

    try:
        call_command("migrate", "jobs", "0024", verbosity=0)
        assert "fenced_deleters" not in _function_source()  # 0023's: UPDATEs by NEW's token
    finally:
        call_command("migrate", "jobs", verbosity=0)
    assert "fenced_deleters" in _function_source()
    assert fenced.commit_checks_missing() == []  # every FencedRow table: this version's trigger
    labels = {meta.label for meta in fenced._fence_tables(connection)}
    assert {"demo.Report", "tests_app.Ledger"} <= labels
