"""Cron schedules: time zones, the missed-tick policies, no pile-up, and exactly once with two
schedulers racing on two database connections."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings

from jobs.core.states import JobState
from jobs.models import Job, Schedule
from jobs.ops import cron as schedules

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)


def plant(name="every-minute", cron="* * * * *", missed="latest", next_at=T0, **fields):
    return Schedule.objects.create(
        name=name, kind="test.echo", cron=cron, missed=missed, next_at=next_at, **fields
    )


def test_cron_is_evaluated_in_the_schedules_time_zone():
    winter = schedules.next_tick("0 3 * * *", "Europe/Paris", T0)
    summer = schedules.next_tick("0 3 * * *", "Europe/Paris", datetime(2026, 7, 1, tzinfo=UTC))
    assert (winter.hour, summer.hour) == (2, 1)  # 03:00 Paris in UTC
    # Spring forward: 02:30 does not exist on 2026-03-29 in Paris; it runs at 03:00 local.
    spring = schedules.next_tick(
        "30 2 * * *", "Europe/Paris", datetime(2026, 3, 28, 12, tzinfo=UTC)
    )
    assert spring == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_a_fixed_time_schedule_runs_once_on_the_fall_back_night():
    """Found in review: "30 2 * * *" in Paris ran at 02:30 summer time and again at 02:30 winter
    time (00:30 and 01:30 UTC on 2026-10-25). Vixie cron runs it once; so do we."""
    declared = {"nightly": {"kind": "test.echo", "cron": "30 2 * * *", "timezone": "Europe/Paris"}}
    with override_settings(JOBS_SCHEDULES=declared):
        schedules.sync(datetime(2026, 10, 24, 12, tzinfo=UTC))
    now = datetime(2026, 10, 25, 0, 30, 5, tzinfo=UTC)
    for _ in range(3):  # 00:30, 01:30 and 02:30 UTC, each run finished before the next
        schedules.run_due(now)
        Job.objects.update(state=JobState.SUCCEEDED, finished_at=now)
        now += timedelta(hours=1)
    keys = list(Job.objects.values_list("unique_key", flat=True))
    assert keys == ["schedule:nightly:2026-10-25T00:30:00Z"]
    assert Schedule.objects.get().next_at == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)


def test_a_due_tick_is_enqueued_once_with_a_key_per_tick():
    plant()
    first = schedules.run_due(T0 + timedelta(seconds=5))
    again = schedules.run_due(T0 + timedelta(seconds=6))
    assert (first.enqueued, again.enqueued) == (1, 0)
    job = Job.objects.get()
    assert job.unique_key == "schedule:every-minute:2026-01-15T12:00:00Z"
    row = Schedule.objects.get()
    assert row.next_at == T0 + timedelta(minutes=1) and row.last_job_id == job.pk


def test_latest_policy_runs_the_most_recent_missed_tick_once():
    plant(missed="latest")
    report = schedules.run_due(T0 + timedelta(minutes=10, seconds=5))
    assert (report.enqueued, report.skipped) == (1, 10)
    assert Job.objects.get().unique_key.endswith("12:10:00Z")
    assert Schedule.objects.get().next_at == T0 + timedelta(minutes=11)


def test_skip_policy_still_runs_a_tick_within_the_grace():
    plant(missed="skip")
    report = schedules.run_due(T0 + timedelta(minutes=10, seconds=30))  # 12:10 is 30 s late
    assert (report.enqueued, report.skipped) == (1, 10)


def test_skip_policy_enqueues_nothing_when_the_latest_tick_is_too_late():
    plant(cron="0 * * * *", missed="skip")  # hourly; 12:00 is now 5 minutes late
    report = schedules.run_due(T0 + timedelta(minutes=5))
    assert (report.enqueued, report.skipped) == (0, 1)
    assert Schedule.objects.get().next_at == T0 + timedelta(hours=1)


def test_all_policy_catches_up_one_tick_at_a_time_without_overlap():
    plant(missed="all")
    now = T0 + timedelta(minutes=3, seconds=1)  # ticks 12:00 .. 12:03 are due
    assert schedules.run_due(now).enqueued == 1
    assert schedules.run_due(now).enqueued == 0  # 12:00's job is still queued: 12:01 waits
    Job.objects.update(state=JobState.SUCCEEDED, finished_at=now)
    assert schedules.run_due(now).enqueued == 1
    keys = sorted(Job.objects.values_list("unique_key", flat=True))
    assert [k[-9:] for k in keys] == ["12:00:00Z", "12:01:00Z"]


def test_all_policy_far_behind_keeps_the_last_100_ticks_and_runs_the_first_at_once():
    plant(missed="all")
    now = T0 + timedelta(minutes=150, seconds=1)  # 151 ticks due: 12:00 .. 14:30
    report = schedules.run_due(now)
    # 12:00 .. 12:50 dropped; 12:51 .. 14:30 kept, the oldest of them enqueued in this pass
    assert (report.enqueued, report.skipped) == (1, 51)
    assert Job.objects.get().unique_key.endswith("12:51:00Z")
    assert Schedule.objects.get().next_at == T0 + timedelta(minutes=52)
    Job.objects.update(state=JobState.SUCCEEDED, finished_at=now)
    assert (schedules.run_due(now).enqueued, Job.objects.count()) == (1, 2)  # 12:52 follows


def test_all_policy_days_behind_is_decided_in_one_pass():
    plant(missed="all")
    now = T0 + timedelta(days=5, seconds=1)  # 7,201 minutely ticks due
    report = schedules.run_due(now)
    assert report.enqueued == 1
    assert Job.objects.get().unique_key.endswith("2026-01-20T10:21:00Z")  # 100 ticks back
    assert report.skipped == 7_201 - 100
    plant(name="further", missed="all", next_at=T0 - timedelta(days=30))
    assert schedules.run_due(now).skipped == schedules.MAX_SKIPPED_COUNTED  # counted up to it


def test_a_tick_never_starts_while_the_previous_run_is_live():
    plant(missed="latest")
    schedules.run_due(T0 + timedelta(seconds=1))
    report = schedules.run_due(T0 + timedelta(minutes=1, seconds=1))  # 12:00's job still queued
    assert (report.enqueued, report.skipped) == (0, 1)
    assert Job.objects.count() == 1


def test_sync_creates_updates_and_disables_declared_schedules():
    declared = {"digest": {"kind": "test.echo", "cron": "*/15 * * * *", "timezone": "UTC"}}
    with override_settings(JOBS_SCHEDULES=declared):
        schedules.sync(T0 + timedelta(minutes=1))
    row = Schedule.objects.get(name="digest")
    assert row.next_at == T0 + timedelta(minutes=15) and row.enabled
    with override_settings(JOBS_SCHEDULES={}):
        schedules.sync(T0)
    assert not Schedule.objects.get(name="digest").enabled


def test_a_schedule_whose_kind_disappeared_is_skipped_and_the_others_run():
    plant(name="orphan").__class__.objects.filter(name="orphan").update(kind="gone.kind")
    plant(name="fine")
    report = schedules.run_due(T0 + timedelta(seconds=1))
    assert report.enqueued == 1 and Job.objects.get().kind == "test.echo"


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_racing_enqueue_each_tick_once():
    plant(missed="all", cron="* * * * *", next_at=T0)
    now = T0 + timedelta(minutes=30)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def scheduler() -> None:
        try:
            start.wait()
            for _ in range(1000):  # until every tick is enqueued (a deadline, not a count)
                if not Schedule.objects.filter(next_at__lte=now).exists():
                    break
                schedules.run_due(now)
                Job.objects.filter(state=JobState.QUEUED).update(
                    state=JobState.SUCCEEDED, finished_at=now
                )
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=scheduler) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    keys = list(Job.objects.values_list("unique_key", flat=True))
    assert len(keys) == len(set(keys)) == 31  # 12:00 .. 12:30, each once
    assert Schedule.objects.get().ticks_enqueued == 31
