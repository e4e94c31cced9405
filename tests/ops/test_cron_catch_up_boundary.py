"""The `all` catch-up's boundary when the pass's `now` falls exactly on a tick (jobs/ops/cron.py
`_decide`, `_ticks_back`): the forward walk counts a tick at `now` as due, and so must the
window kept when far behind -- croniter's get_prev alone is strictly before `now`. Before, with
101 ticks due and the last at `now`, the pass kept 101 (not the last 100) yet counted one as
skipped: 101 enqueued and 1 skipped for 101 ticks. Found in review."""

from datetime import timedelta

import pytest

from jobs.core.states import JobState
from jobs.models import Job, Schedule
from jobs.ops import cron as schedules
from tests.ops.test_schedules import T0, plant

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("behind", "first_kept"),
    [
        (timedelta(minutes=100), "12:01:00Z"),  # 101 due, the last at `now`: 12:00 dropped
        (timedelta(minutes=100, seconds=30), "12:01:00Z"),  # the same ticks, `now` between two
        (timedelta(minutes=99), "12:00:00Z"),  # 100 due, the last at `now`: nothing dropped
    ],
)
def test_all_far_behind_keeps_the_last_100_ticks_now_included_and_counts_each_tick_once(
    behind: timedelta, first_kept: str
) -> None:
    plant(missed="all")
    now = T0 + behind  # the schedule's first tick is T0, 12:00, every minute
    due = int(behind.total_seconds() // 60) + 1
    report = schedules.run_due(now)
    assert report.enqueued == 1
    assert Job.objects.get().unique_key.endswith(first_kept)
    enqueued, skipped = 1, report.skipped
    for _ in range(200):  # each tick runs once the one before it ended
        Job.objects.update(state=JobState.SUCCEEDED, finished_at=now)
        step = schedules.run_due(now)
        if not step.enqueued:
            break
        enqueued += step.enqueued
        skipped += step.skipped
    row = Schedule.objects.get()
    assert enqueued == row.ticks_enqueued == min(due, 100)
    assert skipped == row.ticks_skipped == due - min(due, 100)
    assert (
        Job.objects.order_by("-pk")
        .first()
        .unique_key.endswith(  # type: ignore[union-attr]
            (T0 + timedelta(minutes=due - 1)).strftime("%H:%M:00Z")
        )
    )
