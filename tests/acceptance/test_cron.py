"""Two real qclusters (two embedded schedulers) enqueue each cron tick exactly once."""

import json

import pytest

from jobs.models import Job, Schedule
from tests.acceptance.cluster import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

EVERY_SECOND = {"tick": {"kind": "test.echo", "cron": "* * * * * *", "missed": "latest"}}


def test_two_schedulers_enqueue_each_tick_once(start_qcluster):
    env = {"TEST_JOBS_SCHEDULES": json.dumps(EVERY_SECOND)}
    start_qcluster(**env)
    start_qcluster(**env)
    wait_until(
        lambda: Job.objects.filter(state="succeeded").count() >= 6,
        timeout=30,
        what="six ticks to run",
        job_id=0,
    )
    keys = list(Job.objects.values_list("unique_key", flat=True))
    assert len(keys) == len(set(keys)), sorted(keys)  # no tick enqueued twice
    assert all(k.startswith("schedule:tick:") for k in keys)
    row = Schedule.objects.get(name="tick")
    assert row.ticks_enqueued == len(keys) >= 6
