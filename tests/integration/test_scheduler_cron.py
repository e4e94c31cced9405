"""The embedded scheduler's cron passes: nothing a sync or a tick raises ends the scheduler (and
with it qcluster), a declaration that fails to sync stops no other, and one schedule's slowness
decides nothing for another. Found in review: a cron expression croniter could not evaluate
raised CroniterBadDateError (a ValueError) out of EmbeddedScheduler.run, which caught only
DatabaseError, and qcluster exited; and one deadline over a whole pass (16 minutely schedules
8 days behind took 12.5 s) cut the connection inside another schedule's transaction."""

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from croniter import CroniterBadDateError
from django.conf import settings
from django.db import DataError, OperationalError
from django.test import override_settings

from jobs.models import Job, Schedule
from jobs.ops import cron as schedules
from jobs.worker import scheduler
from tests.acceptance.cluster import wait_until
from tests.wake import scheduler_running

pytestmark = pytest.mark.django_db(transaction=True)

EVERY_SECOND = {"kind": "test.echo", "cron": "* * * * * *"}


def test_a_cron_pass_that_raises_is_logged_and_the_next_pass_enqueues(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real, calls = schedules.run_due, []

    def run_due(*args: Any, **kwargs: Any) -> schedules.TickReport:
        calls.append(1)
        if len(calls) == 1:
            raise CroniterBadDateError("failed to find next date")
        return real(*args, **kwargs)

    monkeypatch.setattr(schedules, "run_due", run_due)
    with (
        override_settings(JOBS_SCHEDULES={"tick": EVERY_SECOND}),
        caplog.at_level(logging.ERROR, "jobs.scheduler"),
        scheduler_running(monkeypatch),
    ):
        wait_until(Job.objects.exists, timeout=15, what="a tick after the fault", job_id=0)
    faults = [r for r in caplog.records if "scheduler tick failed" in r.getMessage()]
    assert len(faults) == 1 and faults[0].exc_info is not None  # with its traceback


def test_a_sync_that_raises_is_tried_again_and_the_ticks_run_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real, calls = schedules.sync, []

    def sync(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a bug in sync")
        real(*args, **kwargs)

    monkeypatch.setattr(schedules, "sync", sync)
    monkeypatch.setattr(scheduler, "SYNC_RETRY_SECONDS", 0.5, raising=False)
    with (
        override_settings(JOBS_SCHEDULES={"tick": EVERY_SECOND}),
        scheduler_running(monkeypatch),
    ):
        wait_until(Job.objects.exists, timeout=15, what="a tick once synced", job_id=0)
    assert len(calls) == 2


@pytest.mark.parametrize("error", [ValueError("no next tick"), DataError("refused")])
def test_a_declaration_that_fails_to_sync_is_logged_and_the_others_are_synced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    real = schedules.next_tick

    def next_tick(cron: str, *args: Any) -> Any:
        if cron == "0 3 * * *":
            raise error
        return real(cron, *args)

    monkeypatch.setattr(schedules, "next_tick", next_tick)
    declared = {"bad": {"kind": "test.echo", "cron": "0 3 * * *"}, "fine": EVERY_SECOND}
    with override_settings(JOBS_SCHEDULES=declared):
        schedules.sync()
    assert list(Schedule.objects.values_list("name", flat=True)) == ["fine"]
    assert any("'bad': not synced" in r.getMessage() for r in caplog.records)


def test_a_lost_connection_during_sync_is_the_outage_path_not_a_bad_declaration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def next_tick(*args: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(schedules, "next_tick", next_tick)
    with (
        override_settings(JOBS_SCHEDULES={"tick": EVERY_SECOND}),
        pytest.raises(OperationalError),
    ):
        schedules.sync()


FAR_BEHIND = 6  # schedules 8 days behind: most of a second of croniter each


def test_far_behind_schedules_each_catch_up_and_none_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    behind = datetime.now(UTC) - timedelta(days=8)
    declared = {}
    for i in range(FAR_BEHIND):
        declared[f"s{i}"] = {"kind": "test.echo", "cron": "* * * * *"}
        Schedule.objects.create(name=f"s{i}", kind="test.echo", cron="* * * * *", next_at=behind)
    # A deadline of 1 s: the pass takes several; each schedule's round trips take milliseconds.
    quick = {**settings.JOBS, "DB_TIMEOUT_SECONDS": 1.0}
    with (
        override_settings(JOBS=quick, JOBS_SCHEDULES=declared),  # sync keeps the rows as planted
        caplog.at_level(logging.INFO, "jobs"),
        scheduler_running(monkeypatch),
    ):
        wait_until(
            lambda: Job.objects.count() == FAR_BEHIND,
            timeout=60,
            what="every schedule to enqueue its latest tick",
            job_id=0,
        )
    assert set(Job.objects.values_list("kind", flat=True)) == {"test.echo"}
    assert not Schedule.objects.filter(next_at__lte=behind).exists()  # every one moved
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


def test_a_pass_starts_no_schedule_once_its_time_is_up_and_the_oldest_due_go_first() -> None:
    now = datetime(2026, 1, 15, 12, 0, 30, tzinfo=UTC)
    for name, late in [("a", 1), ("b", 3), ("c", 2)]:
        Schedule.objects.create(
            name=name, kind="test.echo", cron="* * * * *", next_at=now - timedelta(minutes=late)
        )
    first = schedules.run_due(now, budget_seconds=0)  # one schedule, at least, per pass
    assert (first.enqueued, first.deferred) == (1, 2)
    assert Job.objects.get().unique_key.startswith("schedule:b:")  # the longest due
    second = schedules.run_due(now, budget_seconds=60)
    assert (second.enqueued, second.deferred) == (2, 0)
