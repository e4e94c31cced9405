"""Intents and the outbox relay: an intent exists only through its attempt's accepted commit,
two relays never perform one intent, a relay killed between performing and marking is resolved
by reconciliation, a failing target is retried with backoff; counts come from the rows."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from django.db import connection

import jobs
from jobs.context import Held, JobContext
from jobs.core import transitions
from jobs.core.exceptions import InvalidOption
from jobs.effects import outbox, pending, relay
from jobs.models import Intent, Job
from jobs.worker.heartbeat import Finished
from tests.acceptance.cluster import PROJECT_DIR, subprocess_database_url
from tests.integration.attempts import claim, expire_and_reap
from tests.receiver import Received, receiver

pytestmark = pytest.mark.django_db(transaction=True)

A, B = "host-a:1", "host-b:2"
CONCURRENCY = 4


def _hook(r: Received, **extra: object) -> dict[str, object]:
    return {"url": f"{r.url}/hook", "check_url": f"{r.url}/check", "json": extra}


def test_a_zombies_intent_never_reaches_the_outbox():
    with receiver() as r:
        job = jobs.enqueue("test.echo")
        zombie = claim(A)
        zombie.ctx.intent("publish", "webhook", _hook(r, by=1))
        expire_and_reap(job.pk)
        current = claim(B)
        current.ctx.intent("publish", "webhook", _hook(r, by=2))
        assert not Intent.objects.exists()  # nothing is durable before a commit

        zombie.commit("zombie")  # rejected: its intent goes with it
        assert not Intent.objects.exists()

        current.commit("ok")
        (row,) = Intent.objects.all()
        assert (row.job_id, row.attempt, row.key, row.data["json"]) == (
            job.pk,
            2,
            f"{job.pk}:publish",
            {"by": 2},
        )


def test_a_batch_commit_inserts_each_rows_own_intents():
    with receiver() as r:
        first, second = jobs.enqueue("test.echo"), jobs.enqueue("test.echo")
        claimed = transitions.claim(A, limit=2, lease_seconds=30)
        finished = []
        for c in claimed:
            held = Held(c.fence, 30)
            JobContext(held, c.kind, c.payload).intent(
                "publish", "webhook", _hook(r, job=c.fence.job_id)
            )
            finished.append(Finished(held, c, None, time.monotonic()))
        from jobs.worker import completer

        completer.commit(finished)
        by_job = dict(Intent.objects.values_list("job_id", "data"))
        assert by_job[first.pk]["json"] == {"job": first.pk}
        assert by_job[second.pk]["json"] == {"job": second.pk}


def test_an_intent_for_an_unknown_target_or_too_large_is_refused_at_the_call():
    jobs.enqueue("test.echo")
    running = claim(A)
    with pytest.raises(ValueError):
        running.ctx.intent("publish", "nowhere", {})
    with pytest.raises(ValueError):
        running.ctx.intent("publish", "webhook", {"blob": "x" * 70_000})
    with pytest.raises(ValueError):
        running.ctx.intent("bad step", "webhook", {})
    for target in (["webhook"], {"webhook": 1}):  # before: TypeError("unhashable type")
        with pytest.raises(jobs.InvalidOption, match="no outbox target is registered as"):
            running.ctx.intent("publish", target, {})


def test_an_intent_is_the_data_as_it_was_at_the_call():
    # One dict reused for three intents: each keeps its own value (before, every intent held
    # the caller's object and was encoded at the commit: all three stored the last value).
    jobs.enqueue("test.echo")
    running = claim(A)
    data = {"url": "http://127.0.0.1:9/hook", "json": None}
    for n in range(3):
        data["json"] = {"order": n}
        running.ctx.intent(f"notify-{n}", "webhook", data)
    running.commit("ok")
    assert dict(Intent.objects.values_list("step", "data__json__order")) == {
        "notify-0": 0,
        "notify-1": 1,
        "notify-2": 2,
    }


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"url": 5},
        {"url": "ftp://host/x"},
        {"url": "http://"},
        {"url": "http://host:99999/"},
        {"url": "http://[::1/"},
        {"url": "http://host/", "check_url": "file:///etc/passwd"},
    ],
)
def test_a_webhook_intent_the_relay_could_never_call_is_refused_at_the_call(data):
    # Before, these were accepted and committed, and the relay could only park them as failed.
    jobs.enqueue("test.echo")
    running = claim(A)
    with pytest.raises(InvalidOption, match="must be an http"):
        running.ctx.intent("publish", "webhook", data)
    running.commit("ok")
    assert not Intent.objects.exists()


def test_a_webhook_url_in_capitals_is_delivered():
    with receiver() as r:
        jobs.enqueue("test.echo")
        running = claim(A)
        running.ctx.intent("publish", "webhook", {"url": r.url.upper() + "/hook", "json": 1})
        running.commit("ok")
        (intent,) = Intent.objects.all()
        pool = relay.Relay("relay-caps")
        deadline = time.monotonic() + 10
        while Intent.objects.get(pk=intent.pk).state != "done":
            assert time.monotonic() < deadline, Intent.objects.get(pk=intent.pk).last_error
            if not pool.pump():
                pool.freed.wait(0.05)  # until the call ends, or the next look
        assert r.verdicts(intent.key) == ["performed"]


def test_an_attempts_intents_are_bounded_in_number_and_in_size():
    # Every intent rides in its batch's commit: without a bound, one job recording 100,000 of
    # them stalled the commit and every held job's heartbeats (found by a review).
    jobs.enqueue("test.echo")
    running = claim(A)
    hook = {"url": "http://127.0.0.1:9/hook"}
    for n in range(pending.MAX_INTENTS):
        running.ctx.intent(f"n-{n}", "webhook", hook)
    with pytest.raises(InvalidOption, match=f"at most {pending.MAX_INTENTS} intents"):
        running.ctx.intent("one-more", "webhook", hook)
    running.ctx.intent("n-0", "webhook", {**hook, "json": 1})  # a step recorded again: no more
    running.commit("ok")
    assert Intent.objects.count() == pending.MAX_INTENTS

    jobs.enqueue("test.echo")
    running = claim(A)
    blob = {**hook, "json": "x" * 60_000}
    fits = pending.MAX_INTENTS_CHARS // len(json.dumps(blob))
    for n in range(fits):
        running.ctx.intent(f"big-{n}", "webhook", blob)
    with pytest.raises(InvalidOption, match="characters of JSON in all"):
        running.ctx.intent("big-over", "webhook", blob)
    running.ctx.intent("big-0", "webhook", hook)  # replacing frees its size
    running.ctx.intent("big-over", "webhook", blob)
    running.commit("ok")
    assert Intent.objects.filter(job_id=running.ctx.job_id).count() == fits + 1


@pytest.mark.parametrize("spoil", ["not JSON", "past the bound", "nested too deep"])
def test_data_spoiled_after_the_call_changes_nothing_and_stops_no_batch_mate(spoil):
    # Before: a set put in after the call raised TypeError out of the batch commit (every job of
    # the batch left running), deep nesting a RecursionError in the commit thread, and 5 MB
    # went into the outbox past the 64 KB bound.
    first, second = jobs.enqueue("test.echo"), jobs.enqueue("test.echo")
    claimed = transitions.claim(A, limit=2, lease_seconds=30)
    finished, kept = [], []
    for c in claimed:
        held = Held(c.fence, 30)
        data = {"url": "http://127.0.0.1:9/hook", "json": {"job": c.fence.job_id}}
        JobContext(held, c.kind, c.payload).intent("publish", "webhook", data)
        kept.append(data)
        finished.append(Finished(held, c, None, time.monotonic()))
    spoilt = kept[0]["json"]
    if spoil == "not JSON":
        spoilt["x"] = {1, 2}
    elif spoil == "past the bound":
        spoilt["x"] = "x" * (5 * 1024 * 1024)
    else:
        for _ in range(100_000):
            spoilt["n"] = {}
            spoilt = spoilt["n"]
    from jobs.worker import completer

    completer.commit(finished)
    assert set(Job.objects.values_list("state", flat=True)) == {"succeeded"}
    by_job = dict(Intent.objects.values_list("job_id", "data"))
    assert by_job[first.pk]["json"] == {"job": first.pk}  # as it was at the call
    assert by_job[second.pk]["json"] == {"job": second.pk}


def _committed_intents(r: Received, n: int) -> list[str]:
    keys = []
    for _ in range(n):
        jobs.enqueue("test.echo")
        running = claim(A)
        running.ctx.intent("publish", "webhook", _hook(r))
        running.commit(None)
        keys.append(f"{running.ctx.job_id}:publish")
    return keys


def test_two_relays_at_once_never_perform_one_intent():
    with receiver() as r:
        keys = _committed_intents(r, 30)
        barrier = threading.Barrier(2)

        def relay(name: str) -> None:
            try:
                barrier.wait(5)
                while outbox.relay_once(name, limit=3):
                    pass
            finally:
                connection.close()

        threads = [threading.Thread(target=relay, args=(f"relay-{i}",)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(k for k, _, _ in r.calls) == sorted(keys)  # each exactly once
        assert set(Intent.objects.values_list("state", "performs", "claims")) == {("done", 1, 1)}
        assert outbox.counts()["relay_reperforms"] == 0


RELAY_SCRIPT = (
    "import django; django.setup(); from jobs import outbox; "
    "outbox.relay_once('relay-crashing', lease_seconds=1.0)"
)


def test_a_relay_killed_between_performing_and_marking_is_resolved_without_performing_again():
    with receiver() as r:
        job = jobs.enqueue("test.echo")
        running = claim(A)
        running.ctx.intent("publish", "test.crash-after-perform", _hook(r, order=1))
        running.commit(None)
        key = f"{job.pk}:publish"

        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": subprocess_database_url(),
            "PALISADE_TEST_CRASH_AFTER_PERFORM": "1",
        }
        done = subprocess.run(
            [sys.executable, "-c", RELAY_SCRIPT], cwd=PROJECT_DIR, env=env, timeout=60
        )
        assert done.returncode == -9  # SIGKILLed itself after performing, before marking
        assert r.verdicts(key) == ["performed"]
        row = Intent.objects.get()
        assert (row.state, row.performs, row.claims) == ("performing", 1, 1)

        deadline = time.monotonic() + 10
        while not outbox.relay_once("relay-b"):  # due once the crashed relay's lease ran out
            assert time.monotonic() < deadline, "the crashed relay's claim never expired"
            time.sleep(0.05)  # poll interval of a deadline-bound wait

        row.refresh_from_db()
        assert (row.state, row.reconciled, row.performs, row.claims) == ("done", True, 1, 2)
        assert r.verdicts(key) == ["performed"]  # never performed a second time
        counts = outbox.counts()
        assert counts["reconciliation_mismatches"] == 1 and counts["relay_reperforms"] == 0


class _Counting:
    """A target that can neither check tokens nor deduplicate, nor check what it did: it counts
    the calls that reached it (with the relay's token) and has no `reconcile`."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def perform(self, key: str, data: object, token: int) -> None:
        self.tokens.append(token)


def _committed_intent_to(target: str) -> None:
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.intent("publish", target, {})
    running.commit(None)


def test_a_relay_whose_claim_was_taken_over_never_calls_the_target():
    # The relay's own token fences its marks: a relay whose lease ran out before it began the
    # call (a stall between claiming and calling) finds its claim taken over and calls nothing,
    # so even a target that checks no token is called once.
    target = _Counting()
    outbox.register_target("test.counting", target)
    _committed_intent_to("test.counting")
    (stalled,) = outbox.claim("relay-a", lease_seconds=30)
    Intent.objects.update(lease_expires_at="2000-01-01T00:00:00Z")  # its lease ran out
    (current,) = outbox.claim("relay-b")
    assert (stalled.token, current.token) == (1, 2)
    assert outbox.handle(stalled, "relay-a") == "taken-over"
    assert target.tokens == []
    assert outbox.handle(current, "relay-b") == "performed"
    assert target.tokens == [2]
    row = Intent.objects.get()
    assert (row.state, row.performs, row.claims, row.relay) == ("done", 1, 2, "relay-b")


def test_an_unknown_outcome_at_a_target_without_reconcile_is_parked_never_sent_again():
    target = _Counting()
    outbox.register_target("test.counting", target)
    _committed_intent_to("test.counting")
    (first,) = outbox.claim("relay-a")
    Intent.objects.update(performs=1, outcome_unknown=True)  # its call began; no answer came
    Intent.objects.update(lease_expires_at="2000-01-01T00:00:00Z")  # the relay died meanwhile
    (again,) = outbox.claim("relay-b")
    assert outbox.handle(again, "relay-b") == "parked"
    assert target.tokens == []  # never performed again on the relay's own judgement
    row = Intent.objects.get()
    assert (row.state, row.outcome_unknown, row.performs) == ("failed", True, 1)
    assert "cannot check" in row.last_error


def test_a_failing_target_is_retried_with_backoff_until_it_answers():
    with receiver() as r:
        (key,) = _committed_intents(r, 1)
        r.failing = True
        assert outbox.relay_once("relay-a") == 1
        row = Intent.objects.get()
        assert (row.state, row.failures, row.performs) == ("pending", 1, 1)
        assert "503" in row.last_error
        assert outbox.relay_once("relay-a") == 0  # backing off: not due yet
        counts = outbox.counts()
        assert counts["pending_intents"] == 1 and counts["oldest_pending_age_seconds"] >= 0

        r.failing = False
        Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")  # the backoff has passed
        assert outbox.relay_once("relay-a") == 1
        row.refresh_from_db()
        # The 503 was a refusal, so reconciliation found nothing and the relay performed again.
        assert (row.state, row.performs, row.reconciled) == ("done", 2, False)
        assert r.verdicts(key) == ["performed"]
        counts = outbox.counts()
        assert counts["pending_intents"] == 0 and counts["relay_reperforms"] == 1


def test_a_slow_target_holds_up_its_own_intents_not_the_rest_of_the_batch():
    class Slow:
        def __init__(self) -> None:
            self.release = threading.Event()

        def perform(self, key: str, data: object, token: int) -> None:
            self.release.wait(10)  # a target that hangs until the test lets it go

    slow = Slow()
    outbox.register_target("test-slow", slow)
    with receiver() as r:
        jobs.enqueue("test.echo")  # first in the batch, so a serial relay would wait on it
        running = claim(A)
        running.ctx.intent("publish", "test-slow", {})
        running.commit(None)
        fast_keys = _committed_intents(r, 3)

        pool = relay.Relay("relay-a", threads=CONCURRENCY, per_lane=2)
        try:
            deadline = time.monotonic() + 10
            # every healthy intent is performed while the slow one still hangs
            while Intent.objects.filter(key__in=fast_keys, state="done").count() < 3:
                assert time.monotonic() < deadline, "the healthy intents waited for the slow one"
                if not pool.pump():
                    pool.freed.wait(0.05)  # until a call ends, or the next look
            assert Intent.objects.get(target="test-slow").state != "done"
        finally:
            slow.release.set()
        while Intent.objects.get(target="test-slow").state != "done":
            assert time.monotonic() < deadline + 10, "the slow intent was never marked"
            pool.freed.wait(0.05)
        assert Intent.objects.get(target="test-slow").state == "done"
        assert all(r.verdicts(k) == ["performed"] for k in fast_keys)
