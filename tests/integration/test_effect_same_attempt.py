"""One attempt calling one effect step twice at once -- from two of its threads, or nested in
its own `fn` -- is not a stale write, and its threads perform the effect once.

A second thread of the attempt in a step waits for the first (jobs/effects/in_flight.py): once
the first has recorded, its begin finds the row done and returns the recorded result, `fn` not
called. Before, its begin took the row over from its own attempt as from one whose call had
ended unrecorded, and `fn` ran twice at once (performs 2; a mail sent twice). A call nested in
its own `fn` cannot wait for itself: its recorded result comes back to the outer one."""

import threading
import time

import pytest
from django.db import connection

import jobs
from jobs.models import IdempotencyKey, RejectedWrite
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)


def _until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


class _TwoThreads:
    """Two threads of one attempt calling `step`: "first" is inside `fn` (held there until
    released) when "second" calls; `fn` decides by `first()` which one it runs in."""

    def __init__(self, running) -> None:
        self.running = running
        self.first_in, self.release = threading.Event(), threading.Event()
        self.calls: list[str] = []
        self.results: dict[str, object] = {}
        self.errors: list[BaseException] = []

    def first(self) -> bool:
        """In `fn`: record the call; the first thread waits there for the release."""
        name = threading.current_thread().name
        self.calls.append(name)
        if name == "first":
            self.first_in.set()
            self.release.wait(10)
        return name == "first"

    def run(self, step: str, fn) -> None:
        def call() -> None:
            try:
                self.results[threading.current_thread().name] = self.running.ctx.effect(step, fn)
            except BaseException as exc:  # noqa: BLE001  what the tests are about
                self.errors.append(exc)
            finally:
                connection.close()

        first = threading.Thread(target=call, name="first")
        first.start()
        assert self.first_in.wait(10)
        second = threading.Thread(target=call, name="second")
        second.start()
        # The second either waits for the first (the fix) or, before it, performed at once.
        steps = self.running.held.steps
        assert _until(lambda: steps.waiting(step) == 1 or len(self.calls) == 2)
        self.release.set()
        for t in (first, second):
            t.join(20)


def test_two_threads_of_one_attempt_at_one_step_perform_it_once():
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    two = _TwoThreads(running)

    def fn(key: str) -> dict[str, str]:
        two.first()
        return {"charged": key}

    two.run("charge", fn)
    errors, calls, results = two.errors, two.calls, two.results

    assert errors == []
    assert calls == ["first"]  # before: ["first", "second"], the effect performed twice at once
    row = IdempotencyKey.objects.get(key=f"{job.pk}:charge")
    assert (row.status, row.attempt, row.performs, row.repeats) == ("done", 1, 1, 1)
    assert results == {"first": row.result, "second": row.result}
    assert not RejectedWrite.objects.exists()
    assert not running.held.lost.is_set()


def test_a_thread_whose_first_call_of_the_step_raised_performs_it_as_a_retry():
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    two = _TwoThreads(running)

    def fn(key: str) -> str:
        if two.first():
            raise ConnectionError("the receiver hung up")
        return "charged"

    two.run("charge", fn)
    errors, calls = two.errors, two.calls

    assert [type(e) for e in errors] == [ConnectionError]
    assert calls == ["first", "second"]  # unknown whether the first reached it: performed again
    row = IdempotencyKey.objects.get(key=f"{job.pk}:charge")
    assert (row.status, row.result, row.performs) == ("done", "charged", 2)


def test_a_thread_waiting_for_the_step_gives_up_when_the_lease_is_lost():
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    first_in, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def fn(key: str) -> str:
        first_in.set()
        release.wait(10)
        return "charged"

    def second_call() -> None:
        try:
            running.ctx.effect("charge", fn)
        except BaseException as exc:  # noqa: BLE001  what the test is about
            errors.append(exc)
        finally:
            connection.close()

    first = threading.Thread(target=lambda: (running.ctx.effect("charge", fn), connection.close()))
    first.start()
    assert first_in.wait(10)
    second = threading.Thread(target=second_call)
    second.start()
    assert _until(lambda: running.held.steps.waiting("charge") == 1)
    running.held.lost.set()
    second.join(10)
    assert not second.is_alive()
    assert [type(e).__name__ for e in errors] == ["LeaseLost"]
    release.set()
    first.join(20)


def test_an_effect_nested_in_its_own_step_returns_the_recorded_result():
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")

    def outer(key: str) -> str:
        return "outer:" + running.ctx.effect("charge", lambda key: "inner")

    assert running.ctx.effect("charge", outer) == "inner"
    assert IdempotencyKey.objects.get(key=f"{job.pk}:charge").result == "inner"
    assert not RejectedWrite.objects.exists() and not running.held.lost.is_set()
