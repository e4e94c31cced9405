"""The rescue's fence (jobs.worker.rescue, jobs.worker.reaper.rescue): reclaiming at once the
jobs of a worker process seen dead is a compare-and-set decided by the database against the
attempt that worker held -- still the job's current attempt, still open, that worker's, and
claimed before it was seen dead. A job committed, or reclaimed and claimed again, meanwhile is
untouched, and so is an attempt claimed after the death (a new process reusing the pid).
Real claims and commits on PostgreSQL; only the worker is this test process."""

import time

import pytest
from django.db import connection

import jobs
from jobs.core import transitions
from jobs.core.conf import jobs_settings
from jobs.core.identity import owner_of
from jobs.models import Attempt, Job, JobEvent
from jobs.worker import reaper, rescue
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "host-a:4242"  # the worker process seen dead


def test_a_dead_workers_open_attempts_are_reclaimed_at_once_charged_as_confirmed():
    confirmed, unconfirmed = jobs.enqueue("test.echo"), jobs.enqueue("test.echo")
    running = claim(DEAD)
    assert running.claimed.fence.job_id == confirmed.pk
    transitions.confirm_running(running.claimed.fence)
    claim(DEAD)  # `unconfirmed`: claimed in the same batch, never started
    assert reaper.rescue(DEAD, time.monotonic(), "rescue:1") == 2
    confirmed.refresh_from_db()
    unconfirmed.refresh_from_db()
    assert (confirmed.state, confirmed.attempts_released) == ("queued", 0)
    assert (unconfirmed.state, unconfirmed.attempts_released) == ("queued", 1)
    assert set(Attempt.objects.filter(worker=DEAD).values_list("outcome", flat=True)) == {"expired"}
    events = JobEvent.objects.filter(type="expired", worker="rescue:1")
    assert sorted((e.job_id, e.data["charged"], e.data["worker_exited"]) for e in events) == [
        (confirmed.pk, True, True),
        (unconfirmed.pk, False, True),
    ]


def test_an_attempt_claimed_after_the_worker_was_seen_dead_is_not_its_own():
    job = jobs.enqueue("test.echo")
    seen_dead_at = time.monotonic() - 2.0  # the old process with this pid died 2 s ago
    claim(DEAD)  # a new process that reused the pid claims now
    assert reaper.rescue(DEAD, seen_dead_at, "rescue:1") == 0
    assert Job.objects.get(pk=job.pk).state == "running"


@pytest.mark.parametrize("meanwhile", ["committed", "reclaimed and claimed again"])
def test_a_rescue_read_before_the_job_moved_on_changes_nothing(meanwhile: str) -> None:
    job = jobs.enqueue("test.echo")
    running = claim(DEAD)
    (row,) = transitions.find_held_by(DEAD, 0.0, 10)  # the rescue has read the row ...
    if meanwhile == "committed":  # ... and the worker's commit landed after all
        running.commit({"ok": True})
        expected = ("succeeded", 1)
    else:  # ... and it was handed back, and another worker claimed attempt 2
        transitions.release(running.claimed.fence)
        claim("host-b:7")
        expected = ("running", 2)
    assert not transitions.reclaim_expired(
        row, terminal=False, charged=True, worker="rescue:1", gone_for=0.0
    )
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.attempt) == expected
    assert not JobEvent.objects.filter(job_id=job.pk, type="expired").exists()


def test_a_charged_rescue_is_retried_with_the_failures_backoff_not_at_once():
    """A job whose handler kills its worker (out of memory) was due again at once after each
    charged rescue: it burned all its attempts within a second or two (a lease apart before the
    rescue). A worker's death now waits the backoff of a failure (policy.decide_failure)."""
    job = jobs.enqueue("test.echo", max_attempts=5)
    running = claim(DEAD)
    transitions.confirm_running(running.claimed.fence)
    before = Job.objects.get(pk=job.pk).run_at
    assert reaper.rescue(DEAD, time.monotonic(), "rescue:1") == 1
    after = Job.objects.get(pk=job.pk)
    base = jobs_settings().RETRY_BASE_SECONDS
    assert after.state == "queued"
    assert (after.run_at - before).total_seconds() >= base  # attempt 1 failed: base * 2^0
    assert transitions.claim("host-b:7", limit=1, lease_seconds=30) == []  # not due yet


def test_a_pid_that_dies_again_before_its_rescue_is_fenced_on_its_latest_death(monkeypatch):
    """A pid seen dead, alive again (its replacement got the same pid) and dead again before the
    first death's rescue ran (the database was out meanwhile): the rescue kept the FIRST death's
    time, so the attempt the replacement claimed after it was left to its lease. It fences on
    the latest death now -- and an attempt claimed after that one (a third process) is still
    not the dead one's."""
    monkeypatch.setattr(rescue, "_pending", {})
    pid = 4242
    owner = owner_of(pid)
    between, after = jobs.enqueue("test.echo"), jobs.enqueue("test.echo")
    now = time.monotonic()
    rescue.exited(pid, now - 10.0)  # the first process with this pid died 10 s ago
    assert claim(owner).claimed.fence.job_id == between.pk
    with connection.cursor() as cur:  # its replacement claimed 3 s ago (between the deaths)
        cur.execute(
            "UPDATE jobs_attempt SET claimed_at = clock_timestamp() - interval '3 seconds' "
            "WHERE job_id = %s",
            [between.pk],
        )
    rescue.exited(pid, now - 1.0)  # ... and died 1 s ago
    assert claim(owner).claimed.fence.job_id == after.pk  # a third process, alive, claims now
    assert rescue.run() == 1
    assert not rescue.pending()
    assert Job.objects.get(pk=between.pk).state == "queued"
    assert Job.objects.get(pk=after.pk).state == "running"
