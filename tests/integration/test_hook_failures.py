"""A kind's on_finished hook is user code run by the worker after a final write landed: whatever it
raises -- a SystemExit too -- is logged and changes nothing, and never ends the drain's background
thread (its death went unnoticed: batch-mates and later batches ran with no lease extended)."""

import logging
import threading
import time
from dataclasses import replace

import pytest

import jobs
from jobs.context import Held
from jobs.core import transitions
from jobs.core.registry import _handlers
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.models import Attempt, Job
from jobs.worker import completer, runner
from jobs.worker.heartbeat import Finished, Heartbeater

pytestmark = pytest.mark.django_db(transaction=True)
WORKER = "host-a:1"


@pytest.fixture
def heard(monkeypatch) -> list[int]:
    """test.echo's hook: SystemExit for a job whose payload says so, else it hears the job."""
    told: list[int] = []

    def hook(job_id: int, attempt: int, succeeded: bool) -> None:
        if Job.objects.get(pk=job_id).payload.get("hook") == "exit":
            raise SystemExit(0)  # a library calling sys.exit()
        told.append(job_id)

    monkeypatch.setitem(_handlers, "test.echo", replace(_handlers["test.echo"], on_finished=hook))
    return told


def test_a_hook_raising_system_exit_is_logged_and_its_batch_mates_hooks_still_hear(heard, caplog):
    exits, other = jobs.enqueue("test.echo", {"hook": "exit"}), jobs.enqueue("test.echo")
    claimed = transitions.claim(WORKER, limit=2, lease_seconds=30)
    completer.commit([Finished(Held(c.fence, 30), c, {"ok": 1}, time.monotonic()) for c in claimed])
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert heard == [other.pk]
    (failed,) = [r for r in caplog.records if "on_finished hook failed" in r.getMessage()]
    assert f"job {exits.pk}" in failed.getMessage() and failed.exc_info[0] is SystemExit


def test_a_hook_raising_system_exit_on_the_drains_thread_leaves_it_beating(
    heard, monkeypatch, caplog
):
    """The first batch's commit (and hooks) run on the drain's background thread while the runner
    claims the next batch; that batch's slow job must still be beaten (confirmed running)."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(runner.policy, "next_claim_batch", lambda *a, **k: 2)
    jobs.enqueue("test.echo", priority=100)  # alone in the first batch (the drain starts at 1)
    exits = jobs.enqueue("test.echo", {"hook": "exit"}, priority=10)
    other = jobs.enqueue("test.echo", priority=10)
    slow = jobs.enqueue("test.sleep", {"seconds": 1.2}, lease_seconds=1.5)  # beaten every 0.5 s
    assert runner.drain() == 4
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert other.pk in heard
    assert Attempt.objects.get(job=slow).running_confirmed_at is not None  # a beat confirmed it
    hook_failed = f"job {exits.pk} attempt 1: the on_finished hook failed"
    assert [r for r in caplog.records if r.getMessage() == hook_failed]


def test_the_drains_thread_outlives_a_system_exit_from_a_step_and_beats_again(make_job):
    done, waiting = (make_job(state=JobState.RUNNING, attempt=1, worker=WORKER) for _ in "ab")
    raised = threading.Event()

    def commit_raising_once(items):
        if not raised.is_set():
            raised.set()
            raise SystemExit(0)  # what user code under the commit (a hook) once raised

    with Heartbeater(interval=0.05, commit=commit_raising_once) as beats:
        beats.hold(Fence(waiting.pk, 1, WORKER), 600)
        beats.finished(Held(Fence(done.pk, 1, WORKER), 600), None, None)  # type: ignore[arg-type]
        assert raised.wait(10)  # the thread's flush met it
        before = Job.objects.get(pk=waiting.pk).lease_expires_at
        deadline = time.monotonic() + 10
        while Job.objects.get(pk=waiting.pk).lease_expires_at == before:
            assert time.monotonic() < deadline, "no beat after the SystemExit"
            time.sleep(0.02)
        assert beats._thread.is_alive() and not beats.at_risk


def test_a_dead_drain_thread_puts_every_lease_at_risk(make_job, monkeypatch, caplog):
    """Should the thread die all the same, the drain stops claiming and starting jobs (the
    leases it holds are no longer extended), and the death is logged."""
    job = make_job(state=JobState.RUNNING, attempt=1, worker=WORKER, lease_in=600)

    def broken(self, last_beat):
        raise SystemExit(0)  # outside any one step: nothing left to catch it

    monkeypatch.setattr(Heartbeater, "_next_deadline", broken)
    with Heartbeater(interval=60, commit=lambda items: None) as beats:
        beats.hold(Fence(job.pk, 1, WORKER), 600)
        beats._thread.join(10)
        assert beats.at_risk  # a lease just claimed, a good beat just now: at risk all the same
    assert [r for r in caplog.records if "background thread died" in r.getMessage()]
