"""What a handler's leaked thread records after its attempt ended: refused with a clear error,
never held in memory for good.

An attempt's intents and staged-output mark live in memory (jobs/effects/pending.py) until its
final write is decided, which forgets them. Before, a thread the handler left running that
called ctx.intent() (or ctx.stage()) after that moment made a fresh entry for the ended attempt:
nothing would ever commit or forget it -- up to 1 MB per attempt kept for the life of the worker
process, and the intent silently never performed.
"""

import threading

import pytest

import jobs
from jobs.core.exceptions import AttemptEnded, LeaseLost
from jobs.effects import pending
from jobs.models import Intent, StagedOutput
from tests.integration.attempts import Running, claim

pytestmark = pytest.mark.django_db(transaction=True)

A = "host-a:1"
HOOK = {"url": "http://127.0.0.1:9/hook", "json": {}}


def _from_a_leaked_thread(running: Running, record: str) -> BaseException | None:
    """`record` ("intent" or "stage") called on a thread the handler started and left running,
    once its attempt has ended; what it raised."""
    ended, out = threading.Event(), {}

    def leaked() -> None:
        ended.wait(10)
        try:
            if record == "intent":
                running.ctx.intent("late", "webhook", HOOK)
            else:
                running.ctx.stage("late.txt", b"late")
        except BaseException as exc:  # noqa: BLE001  handed to the test
            out["error"] = exc

    thread = threading.Thread(target=leaked, name="leaked-by-handler")
    thread.start()
    running.commit("ok")  # the handler returned; its attempt's final write is decided
    ended.set()
    thread.join(10)
    assert not thread.is_alive()
    return out.get("error")


@pytest.mark.parametrize("record", ["intent", "stage"])
def test_a_record_after_the_attempts_commit_is_refused_and_held_nowhere(record):
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.intent("publish", "webhook", HOOK)
    error = _from_a_leaked_thread(running, record)
    assert pending.peek(running.held.fence) is None  # nothing kept for the ended attempt
    assert running.held.work.intents == {}  # nor by the ctx the leaked thread still holds
    assert isinstance(error, AttemptEnded) and isinstance(error, LeaseLost), error
    assert f"{record} after its attempt ended" in str(error)
    assert list(Intent.objects.values_list("step", flat=True)) == ["publish"]
    assert not StagedOutput.objects.filter(name="late.txt").exists()  # refused before writing


def test_a_record_after_a_failed_attempt_is_refused_too():
    jobs.enqueue("test.echo")
    running = claim(A)
    running.fail("boom")
    with pytest.raises(AttemptEnded):
        try:
            running.ctx.intent("late", "webhook", HOOK)
        finally:
            assert pending.peek(running.held.fence) is None


def test_an_attempt_that_recorded_nothing_still_refuses_a_late_record():
    # Nothing recorded before the end: there was no entry to forget, and the late one used to
    # make one that nobody would ever forget.
    jobs.enqueue("test.echo")
    running = claim(A)
    running.commit("ok")
    with pytest.raises(AttemptEnded):
        try:
            running.ctx.intent("late", "webhook", HOOK)
        finally:
            assert pending.peek(running.held.fence) is None
