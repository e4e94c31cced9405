"""The background heartbeat and the batch commit it hands jobs over to."""

import datetime as dt
import time

import pytest

from jobs.context import Held, JobContext
from jobs.core import transitions
from jobs.core.states import JobState, Write
from jobs.core.transitions import Fence
from jobs.models import Job, RejectedWrite
from jobs.worker import completer
from jobs.worker import heartbeat as heartbeat_module
from jobs.worker.heartbeat import Heartbeater
from tests.conftest import database_now

pytestmark = pytest.mark.django_db
WORKER = "host-a:101"


def running(make_job, attempt: int = 1) -> Fence:
    job = make_job(state=JobState.RUNNING, attempt=attempt, worker=WORKER, lease_in=30)
    return Fence(job.pk, attempt, WORKER)


def test_a_beat_extends_every_held_lease(make_job):
    fences = [running(make_job), running(make_job)]
    before = dict(Job.objects.values_list("id", "lease_expires_at"))
    beats = Heartbeater(interval=60, commit=completer.commit)
    for f in fences:
        beats.hold(f, 120)
    beats.beat_now()
    after = dict(Job.objects.values_list("id", "lease_expires_at"))
    assert all(after[f.job_id] > before[f.job_id] for f in fences)
    assert not RejectedWrite.objects.exists()


# Committed rows: a handler's heartbeat and checkpoint run outside any open transaction.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", ["heartbeat", "checkpoint"])
def test_a_handlers_heartbeat_and_checkpoint_extend_its_lease_on_the_database_clock(
    make_job, write
):
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER, lease_in=5)
    ctx = JobContext(Held(Fence(job.pk, 1, WORKER), 600), "test.echo", {})
    before = database_now()
    ctx.heartbeat() if write == "heartbeat" else ctx.checkpoint({"done": 3, "of": 7})
    after = database_now()
    job.refresh_from_db()
    lease = dt.timedelta(seconds=600)  # the held lease, from the clock of the write
    assert before + lease <= job.lease_expires_at <= after + lease
    assert job.progress == ({"done": 3, "of": 7} if write == "checkpoint" else None)
    assert not RejectedWrite.objects.exists()


def test_a_beat_that_finds_the_lease_gone_flags_the_job_and_records_it(make_job):
    kept, stolen = running(make_job), running(make_job)
    Job.objects.filter(pk=stolen.job_id).update(attempt=2)  # reclaimed and claimed elsewhere
    beats = Heartbeater(interval=60, commit=completer.commit)
    held_kept, held_stolen = beats.hold(kept, 30), beats.hold(stolen, 30)
    beats.beat_now()
    assert held_stolen.lost.is_set() and not held_kept.lost.is_set()
    rejected = RejectedWrite.objects.get()
    assert (rejected.job_id, rejected.write, rejected.attempt_current) == (
        stolen.job_id,
        "heartbeat",
        2,
    )


def test_a_beat_racing_the_commit_of_a_released_job_records_nothing(make_job, monkeypatch):
    fence = running(make_job)
    beats = Heartbeater(interval=60, commit=completer.commit)
    held = beats.hold(fence, 30)
    real = transitions.heartbeat_many

    def runner_commits_mid_beat(fences, confirm=None):
        # The runner releases the job and commits it between the beat's snapshot and its write.
        beats.release(fence)
        transitions.commit(fence, "done")
        return real(fences, confirm)

    monkeypatch.setattr(heartbeat_module.transitions, "heartbeat_many", runner_commits_mid_beat)
    beats.beat_now()
    assert not held.lost.is_set()
    assert not RejectedWrite.objects.exists()
    assert Job.objects.get(pk=fence.job_id).state == JobState.SUCCEEDED


def test_one_batch_commit_lands_current_attempts_and_rejects_stale_ones(make_job):
    current, stale = running(make_job), running(make_job)
    Job.objects.filter(pk=stale.job_id).update(attempt=2)
    rejected = transitions.commit_many([(current, {"n": 1}, ""), (stale, {"n": 2}, "")])
    assert rejected == [stale]
    assert Job.objects.get(pk=current.job_id).result == {"n": 1}
    assert Job.objects.get(pk=stale.job_id).state == JobState.RUNNING
    record = RejectedWrite.objects.get()
    assert (record.job_id, record.write, record.attempt_presented) == (
        stale.job_id,
        Write.COMMIT,
        1,
    )


def test_a_batch_commit_speaks_for_one_worker_only(make_job):
    a, b = running(make_job), running(make_job)
    with pytest.raises(ValueError):
        transitions.commit_many([(a, 1, ""), (Fence(b.job_id, 1, "other:2"), 2, "")])


@pytest.mark.django_db(transaction=True)
def test_a_short_lease_taken_mid_drain_is_beaten_in_time(make_job):
    """The thread may already be waiting out a long interval when a short-lease job arrives."""
    fence = running(make_job)
    first = Job.objects.get(pk=fence.job_id).heartbeat_at
    with Heartbeater(interval=60, commit=completer.commit) as beats:
        beats.hold(fence, 0.6)  # must be beaten within 0.2 s, not after 60
        deadline = time.monotonic() + 5
        while Job.objects.get(pk=fence.job_id).heartbeat_at == first:
            assert time.monotonic() < deadline, "no heartbeat for the short lease"
            time.sleep(0.02)
    assert not RejectedWrite.objects.exists()
