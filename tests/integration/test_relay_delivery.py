"""The relay never re-performs what it cannot confirm, and one dead target delays only its own
intents -- against real local HTTP receivers that are slow, trickle, or do not deduplicate.

- a timeout is *unknown*: reconciled (the relay's token fences the slow first call out at the
  receiver), performed once; with no way to check, parked for an operator, never re-sent;
- a relay stalled between marking and calling is refused by the receiver (lower relay token);
- a check answering anything but 200 or 404 (a 202 or 204 included) cannot tell yet: the intent
  stays pending with its outcome unknown, neither closed nor performed again, until its retry
  horizon passes and it is parked `failed`;
- a call has a total deadline: a trickling target is cut;
- with one target hanging and the janitor stuck on a slow storage, another target's intent is
  delivered within 2 s of its commit by the embedded relay (jobs/worker/maintenance.py).
"""

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.files.storage import FileSystemStorage
from django.db import connection
from django.utils import timezone

import jobs
from jobs.core import lanes
from jobs.core.conf import jobs_settings
from jobs.effects import outbox
from jobs.effects.webhook import OutcomeUnknown, WebhookTarget
from jobs.models import Intent, StagedOutput
from jobs.worker.maintenance import Maintenance
from tests.integration.attempts import claim, commit_intent, expire_and_reap
from tests.receiver import JsonHandler, receiver, serving
from tests.slow_receivers import fencing_receiver, trickling_server, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

outbox.register_target("test.quick-webhook", WebhookTarget(timeout=1.0))


def _due_now() -> None:
    Intent.objects.update(next_try_at=timezone.now() - timedelta(seconds=1))


def test_a_slow_non_deduplicating_target_performs_a_timed_out_intent_once():
    with fencing_receiver(hold_first=True) as r:
        key = commit_intent(
            "test.quick-webhook", {"url": f"{r.url}/hook", "check_url": f"{r.url}/check"}
        )
        assert outbox.relay_once("relay-a") == 1  # the call times out: outcome unknown
        row = Intent.objects.get()
        assert (row.state, row.outcome_unknown, row.performs) == ("pending", True, 1)
        assert "no answer within" in row.last_error

        _due_now()
        assert outbox.relay_once("relay-a") == 1  # check (token 2: 404) -> perform, token 2
        r.release.set()  # the first call's slow work ends: its token 1 is refused
        wait_for(lambda: r.ended == 2, 10, "the first call never ended")
        row.refresh_from_db()
        assert (row.state, row.claims, row.performs, row.reconciled) == ("done", 2, 2, False)
        assert r.performs(key) == [2]  # performed once, by the newer relay token
        assert r.refused == [(key, 1)]


def test_a_timed_out_intent_a_target_cannot_check_is_parked_never_sent_again():
    with fencing_receiver(hold_first=True) as r:
        commit_intent("test.quick-webhook", {"url": f"{r.url}/hook"})  # no check_url
        outbox.relay_once("relay-a")
        _due_now()
        outbox.relay_once("relay-a")
        row = Intent.objects.get()
        assert (row.state, row.outcome_unknown, row.performs) == ("failed", True, 1)
        assert "cannot check" in row.last_error
        assert r.calls == 1  # never sent again on the relay's own judgement


def test_a_relay_stalled_between_marking_and_calling_is_refused_by_its_token():
    class Stalling:
        """The webhook, except that the call with relay token 1 stalls before it is sent."""

        def __init__(self) -> None:
            self.inner = WebhookTarget(timeout=5.0)
            self.stalled, self.resume = threading.Event(), threading.Event()

        def perform(self, key: str, data: Any, token: int) -> None:
            if token == 1:
                self.stalled.set()
                self.resume.wait(20)
            self.inner.perform(key, data, token)

        def reconcile(self, key: str, data: Any, token: int) -> bool | None:
            return self.inner.reconcile(key, data, token)

    target = Stalling()
    outbox.register_target("test.stalling", target)
    with fencing_receiver() as r:
        key = commit_intent("test.stalling", {"url": f"{r.url}/hook", "check_url": f"{r.url}/c"})

        def stalled_relay() -> None:
            try:
                outbox.relay_once("relay-stalled", lease_seconds=0.5)
            finally:
                connection.close()

        zombie = threading.Thread(target=stalled_relay, daemon=True)
        zombie.start()
        assert target.stalled.wait(10)
        wait_for(lambda: outbox.relay_once("relay-b") == 1, 10, "the stalled claim never expired")
        target.resume.set()
        zombie.join(20)
        assert r.performs(key) == [2]
        assert r.refused == [(key, 1)]
        assert Intent.objects.get().state == "done"


class _Undecided:
    """A receiver answering every call and every check with `status` (a 2xx other than 200):
    for a call, "performed"; for a check, "accepted, cannot tell yet". Counts both."""

    def __init__(self, status: int) -> None:
        self.status, self.posts, self.checks = status, 0, 0
        self.lock = threading.Lock()

    def handler(self) -> type[JsonHandler]:
        r = self

        class Handler(JsonHandler):
            def _empty(self) -> None:
                self.send_response(r.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with r.lock:
                    r.posts += 1
                self._empty()

            def do_GET(self) -> None:  # noqa: N802
                with r.lock:
                    r.checks += 1
                self._empty()

        return Handler


@pytest.mark.parametrize("status", [202, 204])
def test_a_check_answering_another_2xx_cannot_tell_yet_and_leaves_the_intent_unknown(status):
    undecided = _Undecided(status)
    with serving(undecided.handler()) as url:
        data = {"url": f"{url}/hook", "check_url": f"{url}/check"}
        WebhookTarget(timeout=5.0).perform("1:publish", data, 1)  # a call's 2xx: performed
        with pytest.raises(OutcomeUnknown, match=f"answered {status}: cannot tell yet"):
            WebhookTarget(timeout=5.0).reconcile("1:publish", data, 1)
        assert (undecided.checks, undecided.posts) == (1, 1)

        commit_intent("test.quick-webhook", data)
        # A relay died mid-call: the outcome is unknown, so the next try asks the check first.
        Intent.objects.update(outcome_unknown=True, performs=1, claims=1)
        assert outbox.relay_once("relay-a") == 1
        row = Intent.objects.get()
        assert (row.state, row.outcome_unknown, row.reconciled) == ("pending", True, False)
        assert (row.performs, row.failures) == (1, 1)
        assert "cannot tell yet" in row.last_error
        assert (undecided.checks, undecided.posts) == (2, 1)  # asked, never performed again

        # Past its retry horizon it is given up like any intent, still unknown, never performed.
        horizon = timedelta(hours=jobs_settings().INTENT_RETRY_HOURS)
        Intent.objects.update(retry_since=timezone.now() - horizon - timedelta(minutes=1))
        _due_now()
        assert outbox.relay_once("relay-a") == 1
        row.refresh_from_db()
        assert (row.state, row.outcome_unknown, row.failures) == ("failed", True, 2)
        assert (undecided.checks, undecided.posts) == (3, 1)


def test_a_trickling_target_is_cut_at_the_calls_total_deadline():
    with trickling_server() as t:
        started = time.monotonic()
        with pytest.raises((OutcomeUnknown, TimeoutError)):
            WebhookTarget(timeout=1.0).perform("1:x", {"url": f"{t.url}/hook", "json": {}})
        assert time.monotonic() - started < 3.0


class _StuckStorage(FileSystemStorage):
    """A storage whose deletes hang until the test ends (a storage backend that stopped)."""

    release = threading.Event()
    deleting = threading.Event()

    def delete(self, name: str) -> None:
        type(self).deleting.set()
        type(self).release.wait(30)
        super().delete(name)


def test_one_hanging_target_delays_only_its_own_intents(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "stuck": {
            "BACKEND": f"{__name__}._StuckStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "stuck", "ORPHAN_GRACE_SECONDS": 0.0}
    with trickling_server() as dead, receiver() as healthy:
        # An orphan for the janitor, whose storage hangs on delete.
        job = jobs.enqueue("test.echo")
        claim("host-a:1").ctx.stage("lost.txt", b"x")
        expire_and_reap(job.pk)
        later = timezone.now() + timedelta(days=1)  # requeued; not claimed again in this test
        jobs.models.Job.objects.filter(pk=job.pk).update(run_at=later)
        for _ in range(6):  # more intents for the dead target than the relay has threads
            commit_intent("webhook", {"url": f"{dead.url}/hook", "json": {}})

        maintenance = Maintenance("test-maintenance")
        maintenance.start()
        try:
            wait_for(lambda: dead.connections >= 1, 10, "the relay never called the dead target")
            wait_for(_StuckStorage.deleting.is_set, 10, "the janitor never swept")
            committed = time.monotonic()
            key = commit_intent("webhook", {"url": f"{healthy.url}/hook", "json": {"n": 1}})
            wait_for(lambda: key in healthy.keys(), 2.0, "the healthy intent waited for others")
            assert time.monotonic() - committed < 2.0
            assert StagedOutput.objects.get().settled_at is None  # the janitor is still stuck
        finally:
            _StuckStorage.release.set()
            dead.stop.set()
            maintenance.stop()


def test_a_full_lane_is_left_out_of_the_claim_however_many_intents_it_has_queued():
    job = jobs.enqueue("test.echo")
    dead, healthy = "http://10.0.0.1:81", "http://10.0.0.2:82"
    rows = [
        Intent(job=job, attempt=1, step=f"d{i}", key=f"{job.pk}:d{i}", target="webhook",
               data={"url": f"{dead}/hook"})
        for i in range(50)
    ]  # fmt: skip
    rows.append(
        Intent(job=job, attempt=1, step="h", key=f"{job.pk}:h", target="webhook",
               data={"url": f"{healthy}/hook"})
    )  # fmt: skip
    Intent.objects.bulk_create(rows)
    busy = {f"webhook {dead}": 2}  # this relay already has the dead lane's two calls in flight
    (taken,) = outbox.claim("relay-a", limit=2, per_lane=2, busy=busy)
    assert taken.key == f"{job.pk}:h"
    assert lanes.lane("webhook", {"url": f"{dead}/x"}) == f"webhook {dead}"
