"""Token-checked writes to the application's own table (demo.Report, a FencedRow): a lower attempt
of the same job is refused, an equal one is an idempotent retry, the refusal is recorded like
every stale write; a zombie racing a newer attempt on a second connection changes no row. (The
job's current attempt deciding every write: tests/integration/test_token_writes.py.)"""

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

import jobs
from demo.models import Report
from jobs.core import transitions
from jobs.core.exceptions import InvalidOption
from jobs.core.registry import get_handler
from jobs.effects import fenced
from jobs.models import Job, RejectedWrite
from jobs.worker import runner
from tests.integration.attempts import Running, claim, expire_and_reap

pytestmark = pytest.mark.django_db(transaction=True)

A, B = "host-a:1", "host-b:2"


def test_a_lower_attempt_is_refused_and_recorded_an_equal_one_accepted():
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    expire_and_reap(job.pk)
    current = claim(B)
    report = Report.objects.create(name="daily")
    reports = Report.objects.filter(pk=report.pk)

    assert current.ctx.fenced_write(reports, body="from attempt 2", rows=2) == 1
    assert current.ctx.fenced_write(reports, body="attempt 2, retried", rows=2) == 1  # equal

    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_write(reports, body="from attempt 1", rows=1)

    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == (
        "attempt 2, retried",
        job.pk,
        2,
    )
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        "token_write",
        1,
        2,
    )
    assert rejected.resource == f"demo.Report:{report.pk}"


def test_another_jobs_token_does_not_block_a_write():
    first = jobs.enqueue("test.echo")
    claim(A)
    report = Report.objects.create(name="shared")
    Report.objects.filter(pk=report.pk).update(fence_job_id=first.pk, fence_attempt=9)
    jobs.enqueue("test.echo")
    other = claim(B)
    assert other.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="other job") == 1


def test_a_model_without_the_mixin_is_refused():
    from jobs.models import Job

    jobs.enqueue("test.echo")
    running = claim(A)
    with pytest.raises(ValueError):
        running.ctx.fenced_write(Job.objects.all(), error="x")


def _blocked_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cur.fetchone()
    return bool(row and row[0] == "Lock")


def test_a_zombie_racing_a_newer_attempt_changes_no_row_of_its_write(second_connection):
    # Attempt 1 still owns the job when its write begins; meanwhile, on a second connection, the
    # job is taken over (attempt 2) and the new attempt writes the second row, uncommitted. The
    # zombie's write waits on that row lock and, once it is released, changes neither row: its
    # first row is not left changed beside a refused second one.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    Report.objects.create(name="first", body="before")
    second = Report.objects.create(name="second")
    outcome: dict[str, object] = {}
    started = threading.Event()

    def zombie_writer() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cur.fetchone()[0]
            started.set()
            outcome["decision"] = fenced.write(
                zombie.claimed.fence, Report.objects.order_by("-pk"), body="zombie"
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
        thread = threading.Thread(target=zombie_writer)
        thread.start()
        assert started.wait(5)
        deadline = time.monotonic() + 10
        while not _blocked_on_a_lock(int(outcome["pid"])):  # type: ignore[call-overload]
            assert time.monotonic() < deadline, "the zombie's write never waited on the row lock"
            time.sleep(0.01)  # poll interval of a deadline-bound wait
    thread.join(10)
    decision = outcome["decision"]
    assert isinstance(decision, fenced.TokenDecision)
    assert decision.refused and decision.updated == 0
    assert decision.attempt_current == 2
    assert dict(Report.objects.values_list("name", "body")) == {
        "first": "before",
        "second": "attempt 2",
    }


def _decided_behind_a_takeover(
    second_connection: Any, job_id: int, report_id: int, act: Callable[[], object]
) -> dict[str, object]:
    """On a thread: `act()` (a zombie's token-checked write or delete, in its handler's
    transaction) while `second_connection`'s open transaction holds the report row and takes the
    job over (attempt 2) without touching the row's token. Returns what `act` decided
    ("decision"), or the COMMIT's refusal ("commit"), once it has waited on the row lock."""
    outcome: dict[str, object] = {}
    started = threading.Event()

    def zombie() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cur.fetchone()[0]
            started.set()
            with transaction.atomic():
                outcome["decision"] = act()
        except IntegrityError as exc:  # refused at the COMMIT instead
            outcome["commit"] = exc
        finally:
            connection.close()

    with second_connection.transaction():
        second_connection.execute("UPDATE demo_report SET rows = 5 WHERE id = %s", [report_id])
        second_connection.execute("UPDATE jobs_job SET attempt = 2 WHERE id = %s", [job_id])
        thread = threading.Thread(target=zombie)
        thread.start()
        assert started.wait(5)
        deadline = time.monotonic() + 10
        while not _blocked_on_a_lock(int(outcome["pid"])):  # type: ignore[call-overload]
            assert time.monotonic() < deadline, "the zombie never waited on the row lock"
            time.sleep(0.01)  # poll interval of a deadline-bound wait
    thread.join(10)
    return outcome


def test_a_zombie_waiting_on_a_row_whose_writer_took_the_job_over_is_refused_at_its_statement(
    second_connection,
):
    # The application's transaction that locks the row also takes the job over (attempt 2),
    # without touching the row's token. The zombie's write, inside its handler's transaction,
    # waits for that row; once it is released the write is refused then and there -- its rows
    # are locked first, so its UPDATE's job check is read after the takeover committed -- not
    # accepted, to be refused only at its transaction's COMMIT.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    report = Report.objects.create(name="daily", body="before")
    outcome = _decided_behind_a_takeover(
        second_connection,
        job.pk,
        report.pk,
        lambda: fenced.write(
            zombie.claimed.fence, Report.objects.filter(pk=report.pk), body="zombie"
        ),
    )
    decision = outcome.get("decision")
    assert isinstance(decision, fenced.TokenDecision) and decision.refused, outcome
    assert decision.attempt_current == 2 and "commit" not in outcome
    report.refresh_from_db()
    assert (report.body, report.rows, report.fence_attempt) == ("before", 5, 0)


# -- the COMMIT decides again (jobs/core/sql/fenced.py) -------------------------------------------


def _taken_over_elsewhere(job_id: int) -> Running:
    """Attempt 1's lease runs out, the reaper takes the job back and attempt 2 claims it: on
    another thread's connection, committed while this thread's transaction stays open."""
    out: list[Running] = []

    def run() -> None:
        try:
            expire_and_reap(job_id)
            out.append(claim(B))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert out, "the takeover did not finish"
    return out[0]


def _written_then_taken_over(zombie: Running, rows, job_id: int) -> str | None:
    """`zombie` writes `rows` in a transaction of its own; the job is taken over before that
    transaction commits. The COMMIT must refuse: returns the label the refusal names."""
    with pytest.raises(IntegrityError) as refused:
        with transaction.atomic():
            zombie.ctx.fenced_write(rows, body="zombie")
            _taken_over_elsewhere(job_id)
    return fenced.refused_at_commit(refused.value)


def test_a_write_whose_job_is_taken_over_before_its_transaction_commits_is_rolled_back():
    # The UPDATE runs while attempt 1 still owns the job; the takeover commits before the
    # handler's own transaction does. The COMMIT refuses, and nothing of that transaction stays.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    report = Report.objects.create(name="daily", body="before")
    with pytest.raises(IntegrityError) as refused:
        with transaction.atomic():
            assert zombie.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie") == 1
            Report.objects.create(name="beside it")  # the transaction's other writes go too
            _taken_over_elsewhere(job.pk)
    assert fenced.refused_at_commit(refused.value) == "demo.Report"
    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == ("before", None, 0)
    assert not Report.objects.filter(name="beside it").exists()


def test_a_takeover_waits_for_a_commit_whose_check_has_passed():
    # The check at the COMMIT holds the job row FOR SHARE until the COMMIT ends: a takeover
    # arriving between the check and the COMMIT waits, so the rows are never committed by an
    # attempt that no longer owns the job. `SET CONSTRAINTS ALL IMMEDIATE` runs the check early,
    # which leaves that gap open for as long as the test needs.
    job = jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="daily")
    seen: dict[str, object] = {}
    asked = threading.Event()

    def takeover() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                seen["pid"] = cur.fetchone()[0]
            asked.set()
            expire_and_reap(job.pk)
            seen["attempt"] = claim(B).claimed.fence.attempt
        finally:
            connection.close()

    thread = threading.Thread(target=takeover)
    with transaction.atomic():
        owner.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="mine")
        with connection.cursor() as cur:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the COMMIT's check, passed now
        thread.start()
        assert asked.wait(5)
        deadline = time.monotonic() + 10
        while not _blocked_on_a_lock(int(seen["pid"])):  # type: ignore[call-overload]
            assert thread.is_alive(), "the takeover did not wait for the checked COMMIT"
            assert time.monotonic() < deadline, "the takeover never waited on the job row"
            time.sleep(0.01)  # poll interval of a deadline-bound wait
    thread.join(30)
    assert seen.get("attempt") == 2
    report.refresh_from_db()
    assert (report.body, report.fence_attempt) == ("mine", 1)  # committed while it owned the job


def _committed_on_another_connection(action: Callable[[], object]) -> None:
    done: list[bool] = []

    def run() -> None:
        try:
            action()
            done.append(True)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert done, "the other connection's action did not finish"


@pytest.mark.parametrize("take_back", ["reaped", "cancelled", "requeued"])
def test_a_write_whose_job_is_taken_back_before_its_transaction_commits_is_rolled_back(
    take_back,
):
    # Nobody has claimed the job again: the attempt number the COMMIT finds is still the
    # writer's, and only the job's state says the job is no longer its.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    report = Report.objects.create(name="daily", body="before")
    actions = {
        "reaped": lambda: expire_and_reap(job.pk),
        "cancelled": lambda: transitions.cancel(job.pk, "ops@example.com"),
        "requeued": lambda: transitions.requeue(job.pk, "ops@example.com"),
    }
    with pytest.raises(IntegrityError) as refused:
        with transaction.atomic():
            assert zombie.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie") == 1
            _committed_on_another_connection(actions[take_back])
    assert fenced.refused_at_commit(refused.value) == "demo.Report"
    assert Job.objects.get(pk=job.pk).attempt == 1
    report.refresh_from_db()
    assert (report.body, report.fence_attempt) == ("before", 0)


def test_the_owner_commits_its_write_in_its_own_transaction():
    job = jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="daily")
    with transaction.atomic():
        owner.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="mine")
        Report.objects.create(name="beside it")
    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == ("mine", job.pk, 1)
    assert Report.objects.filter(name="beside it").exists()


def test_a_plain_save_of_a_row_a_finished_job_wrote_is_not_checked():
    job = jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="daily")
    owner.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="by the job")
    owner.commit()
    assert Job.objects.get(pk=job.pk).state == "succeeded"
    report.refresh_from_db()
    report.body = "edited by hand"
    with transaction.atomic():
        report.save()  # carries the finished job's token; not a token-checked write
    report.refresh_from_db()
    assert (report.body, report.fence_attempt) == ("edited by hand", 1)


def test_a_handler_whose_transaction_commit_is_refused_is_lost_and_recorded():
    # The runner's view: the handler's own `transaction.atomic()` raised at its COMMIT. The
    # attempt is lost (its work discarded, no failure written) and the refusal recorded like a
    # refused UPDATE.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    report = Report.objects.create(name="daily")

    def handler(ctx: jobs.JobContext) -> str:
        with transaction.atomic():
            ctx.fenced_write(Report.objects.filter(pk=report.pk), body="zombie")
            _taken_over_elsewhere(ctx.job_id)
        return "never"

    fn = dataclasses.replace(get_handler("test.echo"), fn=handler)
    outcome = runner.execute(fn, zombie.ctx)
    assert (outcome.succeeded, outcome.lost, outcome.error) == (False, True, "")
    assert zombie.held.lost.is_set()
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        "token_write",
        1,
        2,
    )
    assert (rejected.state_current, rejected.resource) == ("running", "demo.Report")
    report.refresh_from_db()
    assert report.body == ""


def test_a_fenced_row_table_without_its_commit_check_is_refused_until_migrate(monkeypatch):
    monkeypatch.setattr(fenced, "_CHECKED", set())
    jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="daily")
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER jobs_fence_at_commit ON demo_report")
    try:
        with pytest.raises(InvalidOption, match="manage.py migrate"):
            owner.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="unchecked")
        report.refresh_from_db()
        assert report.body == ""
    finally:
        installed = fenced.install_commit_checks()  # what every migrate runs (jobs.apps)
    assert "demo.Report" in installed
    assert "demo.Report" not in fenced.install_commit_checks()  # in place: left alone
    with connection.cursor() as cur:  # an older version's trigger: replaced
        cur.execute("COMMENT ON TRIGGER jobs_fence_at_commit ON demo_report IS 'palisade old'")
    assert "demo.Report" in fenced.install_commit_checks()
    with connection.cursor() as cur:  # a disabled one: refused, then enabled again by migrate
        cur.execute("ALTER TABLE demo_report DISABLE TRIGGER jobs_fence_at_commit")
    monkeypatch.setattr(fenced, "_CHECKED", set())
    with pytest.raises(InvalidOption, match="no enabled"):
        owner.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="unchecked")
    assert "demo.Report" in fenced.install_commit_checks()
    assert owner.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="checked") == 1


def test_under_repeatable_read_a_heartbeat_after_the_snapshot_fails_the_commit(second_connection):
    # docs/effects.md: the COMMIT's share lock on a job row changed after the snapshot is a
    # serialization failure under REPEATABLE READ, even for the attempt that owns the job.
    from django.db import OperationalError

    job = jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="daily")
    with pytest.raises(OperationalError, match="could not serialize"):
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            owner.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="mine")
            second_connection.execute(
                "UPDATE jobs_job SET heartbeat_at = clock_timestamp() WHERE id = %s", [job.pk]
            )
            second_connection.commit()
    report.refresh_from_db()
    assert report.body == ""
    assert Job.objects.get(pk=job.pk).attempt == 1  # still the owner's


def test_a_plain_save_after_a_fenced_write_in_the_same_transaction_is_not_checked():
    # Row B carries a finished job's token; the owner writes row A through fenced_write, then
    # the handler saves B by hand in the same transaction: only A's UPDATE queued a check.
    finished = jobs.enqueue("test.echo")
    first = claim(A)
    b = Report.objects.create(name="b")
    first.ctx.fenced_write(Report.objects.filter(pk=b.pk), body="by the finished job")
    first.commit()
    assert Job.objects.get(pk=finished.pk).state == "succeeded"
    jobs.enqueue("test.echo")
    owner = claim(B)
    a = Report.objects.create(name="a")
    b.refresh_from_db()
    with transaction.atomic():
        owner.ctx.fenced_write(Report.objects.filter(pk=a.pk), body="owner")
        b.body = "edited by hand"
        b.save()
    b.refresh_from_db()
    assert (b.body, b.fence_job_id) == ("edited by hand", finished.pk)


def test_the_fence_columns_types_can_still_be_altered():
    # The trigger's WHEN names no column, so an application's AlterField on them applies.
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE demo_report ALTER COLUMN fence_attempt TYPE bigint")
        cur.execute("ALTER TABLE demo_report ALTER COLUMN fence_attempt TYPE integer")


def test_a_multi_table_child_is_checked_on_its_parents_table():
    # tests.app.ChildReport's fence columns live in demo_report: the COMMIT's check is there.
    from tests.app.models import ChildReport

    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    child = ChildReport.objects.create(name="child", extra="x")
    rows = ChildReport.objects.filter(pk=child.pk)
    assert zombie.ctx.fenced_write(rows, body="owner") == 1
    assert _written_then_taken_over(zombie, rows, job.pk) == "demo.Report"
    child.refresh_from_db()
    assert child.body == "owner"


def test_an_unmanaged_fenced_row_table_gets_its_commit_check():
    from tests.app.models import Ledger

    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'tests_app_ledger'::regclass "
            "AND tgname = 'jobs_fence_at_commit' AND tgenabled <> 'D'"
        )
        assert cur.fetchone()[0] == 1
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    entry = Ledger.objects.create(name="entry")
    try:
        assert _written_then_taken_over(zombie, Ledger.objects.filter(pk=entry.pk), job.pk) == (
            "tests_app.Ledger"
        )
        entry.refresh_from_db()
        assert entry.body == ""
    finally:  # an unmanaged table is not flushed after the test: a rerun would meet the row
        Ledger.objects.filter(pk=entry.pk).delete()
