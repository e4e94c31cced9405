"""An operator's disable, enable and run-now on cron schedules: what each writes, that each is
audited, that a disable survives the scheduler's sync, and that bad requests change nothing."""

import importlib
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import override_settings

from jobs.models import Job, Schedule
from jobs.ops import cron, cron_controls

pytestmark = pytest.mark.django_db

DECLARED = {"digest": {"kind": "test.echo", "cron": "*/15 * * * *", "timezone": "UTC"}}


@pytest.fixture
def operator_with_change(db: None) -> User:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="change_schedule", content_type__app_label="jobs")
    )
    return user


def plant(name: str = "digest", **fields) -> Schedule:
    return Schedule.objects.create(
        name=name,
        kind="test.echo",
        cron="*/15 * * * *",
        next_at=datetime(2026, 1, 15, 12, tzinfo=UTC),
        **fields,
    )


def test_disable_is_audited_and_stands_across_the_schedulers_sync(operator_with_change) -> None:
    with override_settings(JOBS_SCHEDULES=DECLARED):
        cron.sync()
        assert cron_controls.set_enabled("digest", False, user=operator_with_change)
        cron.sync()  # what every qcluster start does
    assert not Schedule.objects.get(name="digest").enabled
    entry = LogEntry.objects.get()
    assert (entry.user, entry.change_message) == (operator_with_change, "disabled (dashboard)")


def test_a_schedule_declared_again_after_sync_disabled_it_is_enabled_again() -> None:
    with override_settings(JOBS_SCHEDULES=DECLARED):
        cron.sync()
    with override_settings(JOBS_SCHEDULES={}):
        cron.sync()
    assert Schedule.objects.get(name="digest").source == cron.UNDECLARED
    with override_settings(JOBS_SCHEDULES=DECLARED):
        cron.sync()
    row = Schedule.objects.get(name="digest")
    assert row.enabled and row.source == "settings"


def test_a_schedule_an_operator_disabled_then_undeclared_can_be_neither_enabled_nor_run(
    operator_with_change,
) -> None:
    """Found in review: sync left such a row with source `settings`, so enable let it run."""
    with override_settings(JOBS_SCHEDULES=DECLARED):
        cron.sync()
    cron_controls.set_enabled("digest", False, user=operator_with_change)
    with override_settings(JOBS_SCHEDULES={}):
        cron.sync()
    for press in (
        lambda: cron_controls.set_enabled("digest", True, user=operator_with_change),
        lambda: cron_controls.run_now("digest", user=operator_with_change),
    ):
        with pytest.raises(cron_controls.ScheduleControlError, match="no longer declared"):
            press()
    row = Schedule.objects.get(name="digest")
    assert not row.enabled and row.source == cron.UNDECLARED_PAUSED and not Job.objects.exists()
    assert LogEntry.objects.count() == 1  # the disable


def test_run_now_of_a_schedule_no_longer_declared_is_refused(operator_with_change) -> None:
    with override_settings(JOBS_SCHEDULES=DECLARED):
        cron.sync()
    with override_settings(JOBS_SCHEDULES={}):
        cron.sync()
    with pytest.raises(cron_controls.ScheduleControlError, match="no longer declared"):
        cron_controls.run_now("digest", user=operator_with_change)
    assert not Job.objects.exists() and not LogEntry.objects.exists()


def test_an_operators_disable_stands_when_its_schedule_is_declared_again(
    operator_with_change,
) -> None:
    with override_settings(JOBS_SCHEDULES=DECLARED):
        cron.sync()
        cron_controls.set_enabled("digest", False, user=operator_with_change)
    with override_settings(JOBS_SCHEDULES={}):
        cron.sync()
    with override_settings(JOBS_SCHEDULES=DECLARED):
        cron.sync()
    row = Schedule.objects.get(name="digest")
    assert (row.enabled, row.source) == (False, "settings")
    assert cron_controls.set_enabled("digest", True, user=operator_with_change)


def test_enable_moves_the_next_tick_after_now_and_skips_what_was_missed(
    operator_with_change,
) -> None:
    plant(enabled=False)  # its next_at is long past
    assert cron_controls.set_enabled("digest", True, user=operator_with_change)
    row = Schedule.objects.get(name="digest")
    assert row.enabled and row.next_at > datetime.now(UTC) - timedelta(seconds=5)
    assert cron.run_due().enqueued == 0  # nothing missed is caught up


def test_enabling_an_enabled_schedule_changes_and_audits_nothing(operator_with_change) -> None:
    plant()
    assert not cron_controls.set_enabled("digest", True, user=operator_with_change)
    assert not LogEntry.objects.exists()


def test_run_now_enqueues_the_schedules_job_and_records_it_as_the_last_run(
    operator_with_change,
) -> None:
    plant(payload={"n": 1}, queue="mail")
    job = cron_controls.run_now("digest", user=operator_with_change)
    assert (job.kind, job.payload, job.queue) == ("test.echo", {"n": 1}, "mail")
    assert job.unique_key.startswith("schedule:digest:")
    assert Schedule.objects.get(name="digest").last_job_id == job.pk
    assert LogEntry.objects.get().change_message == f"run now (dashboard): enqueued job {job.pk}"


def test_run_now_is_refused_while_the_previous_run_is_live(operator_with_change) -> None:
    plant()
    first = cron_controls.run_now("digest", user=operator_with_change)
    with pytest.raises(cron_controls.ScheduleControlError, match=f"job {first.pk}"):
        cron_controls.run_now("digest", user=operator_with_change)
    assert Job.objects.count() == 1 and LogEntry.objects.count() == 1


def test_run_now_of_a_kind_no_longer_registered_is_refused_and_writes_nothing(
    operator_with_change,
) -> None:
    plant()
    Schedule.objects.filter(name="digest").update(kind="gone.kind")
    with pytest.raises(cron_controls.ScheduleControlError, match="refused by enqueue"):
        cron_controls.run_now("digest", user=operator_with_change)
    assert not Job.objects.exists() and not LogEntry.objects.exists()


def test_a_user_without_the_change_permission_is_refused(db: None) -> None:
    plant()
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    with pytest.raises(PermissionError):
        cron_controls.set_enabled("digest", False, user=viewer)
    with pytest.raises(PermissionError):
        cron_controls.run_now("digest", user=viewer)
    assert Schedule.objects.get(name="digest").enabled and not Job.objects.exists()


def test_an_unknown_schedule_is_a_clear_error(operator_with_change) -> None:
    with pytest.raises(cron_controls.ScheduleControlError, match="no schedule named 'nope'"):
        cron_controls.set_enabled("nope", False, user=operator_with_change)


def test_the_migration_marks_schedules_an_earlier_sync_disabled_as_undeclared() -> None:
    """Before 0014 only sync disabled a row; 0014 marks those rows, so declaring one again
    enables it as it did before, and an operator's later disable is told apart."""
    migration = importlib.import_module("jobs.migrations.0014_screens_indexes").Migration
    plant(name="gone", enabled=False)
    plant(name="live")
    with connection.cursor() as cur:
        cur.execute(migration.operations[0].sql)
    assert Schedule.objects.get(name="gone").source == cron.UNDECLARED
    assert Schedule.objects.get(name="live").source == "settings"
    with override_settings(JOBS_SCHEDULES={"gone": DECLARED["digest"]}):
        cron.sync()
    assert Schedule.objects.get(name="gone").enabled
