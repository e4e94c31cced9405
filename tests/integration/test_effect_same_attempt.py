"""One attempt calling one effect step twice at once -- from two of its threads, or nested in
its own `fn` -- is not a stale write. The second `begin` takes the key over from its own
attempt (as a retry inside the attempt does), both calls reach `fn` with the same key, and the
one that records second finds the row done *by its own attempt*: it returns the recorded result.
Before, it was refused like a zombie's completion: a `RejectedWrite` with the attempt presented
equal to the current one (a false alarm on jobs_stale_writes_rejected_total), `LeaseLost`, and
the live attempt's work thrown away until its lease ran out."""

import threading

import pytest
from django.db import connection

import jobs
from jobs.models import IdempotencyKey, RejectedWrite
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_threads_of_one_attempt_at_one_step_both_get_the_recorded_result():
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    both_in = threading.Barrier(2)
    results: list[object] = []
    errors: list[BaseException] = []

    def fn(key: str) -> dict[str, object]:
        both_in.wait(10)  # each thread has begun the effect before either records it
        return {"charged": key, "by": threading.current_thread().name}

    def call() -> None:
        try:
            results.append(running.ctx.effect("charge", fn))
        except BaseException as exc:  # noqa: BLE001  what the test is about
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=call, name=f"t{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)

    assert errors == []  # before: LeaseLost for one of them
    row = IdempotencyKey.objects.get(key=f"{job.pk}:charge")
    assert (row.status, row.attempt, row.performs) == ("done", 1, 2)
    assert results == [row.result, row.result]  # both return the one recorded
    assert not RejectedWrite.objects.exists()
    assert not running.held.lost.is_set()


def test_an_effect_nested_in_its_own_step_returns_the_recorded_result():
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")

    def outer(key: str) -> str:
        return "outer:" + running.ctx.effect("charge", lambda key: "inner")

    assert running.ctx.effect("charge", outer) == "inner"
    assert IdempotencyKey.objects.get(key=f"{job.pk}:charge").result == "inner"
    assert not RejectedWrite.objects.exists() and not running.held.lost.is_set()
