"""A handler that returns right at its execution timeout is either committed by the runner or
failed by the timeout -- decided once, under the drain's lock (jobs/worker/running.py) -- never
committed and then "failed", which recorded a false rejection and deleted the committed outputs.

The race is made certain, not waited for: the tests hold one side at the moment that decides it
(the background thread's timeout until the runner is past the handler's return, or the handler
until the timeout is under way), each wait on an event with a deadline."""

import os
import threading

import pytest

import jobs
from jobs.core.states import AttemptOutcome, JobState
from jobs.effects import staging
from jobs.models import Attempt, RejectedWrite, StagedOutput
from jobs.worker import runner, watchdog

pytestmark = pytest.mark.django_db(transaction=True)
KIND = "test.timeout_short"  # @handler(timeout=0.5)


@pytest.fixture
def exits(monkeypatch) -> list[int]:
    """The timeout ends the worker process with os._exit: recorded here instead."""
    codes: list[int] = []
    monkeypatch.setattr(os, "_exit", codes.append)
    return codes


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    return tmp_path


@pytest.fixture
def handler_over(monkeypatch) -> threading.Event:
    """Set once the runner is past the handler's return (its watchdog slot emptied)."""
    over = threading.Event()
    real = watchdog.ended

    def ended() -> None:
        real()
        over.set()

    monkeypatch.setattr(watchdog, "ended", ended)
    return over


def test_a_handler_returning_as_its_timeout_fires_is_committed_and_nothing_else(
    monkeypatch, swap_handler, media, exits, handler_over, caplog
):
    fired = threading.Event()
    real_time_out = watchdog.time_out

    def time_out_once_the_handler_returned(*args):
        fired.set()
        handler_over.wait(10)  # the thread took the deadline; the handler returns meanwhile
        real_time_out(*args)

    def returns_as_it_times_out(ctx):
        ctx.stage("out.txt", f"output of attempt {ctx.attempt}")
        fired.wait(10)
        return {"attempt": ctx.attempt}

    monkeypatch.setattr(watchdog, "time_out", time_out_once_the_handler_returned)
    swap_handler(KIND, returns_as_it_times_out)
    job = jobs.enqueue(KIND)
    runner.drain()
    assert fired.is_set() and handler_over.is_set()
    job.refresh_from_db()
    assert (job.state, job.result, job.error) == (JobState.SUCCEEDED, {"attempt": 1}, "")
    assert job.result_ref == staging.prefix(job.pk, 1)
    assert staging.storage().exists(job.result_ref + "out.txt")  # what result_ref names exists
    assert StagedOutput.objects.get(job=job).status == StagedOutput.Status.STAGED
    assert Attempt.objects.get(job=job).outcome == AttemptOutcome.SUCCEEDED
    assert not RejectedWrite.objects.filter(job=job).exists()
    assert exits == []  # the timeout was void: the worker process goes on
    assert not [r for r in caplog.records if "failing it" in r.getMessage()]


def test_a_handler_returning_once_its_timeout_took_it_is_failed_by_the_timeout_alone(
    monkeypatch, swap_handler, media, exits, handler_over
):
    settling = threading.Event()
    real_settling = watchdog.settling

    def settling_while_the_handler_returns(budget):
        real_settling(budget)
        settling.set()
        handler_over.wait(10)

    def returns_while_its_timeout_settles(ctx):
        ctx.stage("out.txt", f"output of attempt {ctx.attempt}")
        settling.wait(10)
        return {"attempt": ctx.attempt}

    monkeypatch.setattr(watchdog, "settling", settling_while_the_handler_returns)
    swap_handler(KIND, returns_while_its_timeout_settles)
    job = jobs.enqueue(KIND)
    runner.drain()
    assert settling.is_set() and handler_over.is_set()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED  # retried, like any failure
    assert (job.result, job.result_ref) == (None, "")
    assert job.error == "exceeded the task timeout of 0.5 s"
    assert Attempt.objects.get(job=job).outcome == AttemptOutcome.FAILED
    assert not RejectedWrite.objects.filter(job=job).exists()  # nothing else was presented
    assert StagedOutput.objects.get(job=job).status == StagedOutput.Status.DISCARDED
    assert exits == [1]
