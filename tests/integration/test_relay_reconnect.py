"""Found by the fault-injection suite (docs/chaos.md): a relay call thread whose database
connection died while its call was out (a database restart or a terminated backend during a
target's 10 s deadline) could not record the call's outcome and left the intent to its lease --
60 s of delay for a call that had ended. It now reads the row again on a fresh connection and,
while its claim still holds, decides the intent as the next relay would: an unknown outcome is
reconciled with the target (never re-sent blind).

Real PostgreSQL, the embedded relay's own thread (jobs.effects.relay.Relay), a real receiver that
performs the call and then hangs past the target's deadline; the relay thread's backend is
terminated while it waits.
"""

import time
from typing import Any

import pytest
from django.db import connection

import jobs
from jobs.effects import outbox
from jobs.effects.relay import Relay
from jobs.effects.webhook import WebhookTarget
from jobs.models import Intent
from tests.integration.attempts import claim
from tests.slow_receivers import fencing_receiver, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

outbox.register_target("test.reconnect-webhook", WebhookTarget(timeout=2.0))
LEASE = 60.0  # the relay's claim lease: the intent must be decided long before it runs out


def _commit_intent(data: dict[str, Any]) -> str:
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", "test.reconnect-webhook", data)
    running.commit(None)
    return f"{job.pk}:publish"


def _terminate_other_backends() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return len(cur.fetchall())


def test_an_intent_whose_relay_lost_its_connection_mid_call_is_decided_without_its_lease():
    with fencing_receiver(hang=30.0) as r:
        key = _commit_intent({"url": f"{r.url}/hook", "check_url": f"{r.url}/check"})
        relay = Relay("relay-a", lease_seconds=LEASE)
        started = time.monotonic()
        assert relay.pump() == 1
        wait_for(lambda: r.performs(key) == [1], 10, "the call never reached the receiver")
        assert _terminate_other_backends() >= 1  # the relay thread's connection, mid-call

        def decided() -> bool:
            return Intent.objects.get().state == Intent.State.DONE

        wait_for(decided, 15, "the intent was left to its relay lease")
        assert time.monotonic() - started < LEASE / 2
        row = Intent.objects.get()
        assert (row.reconciled, row.performs) == (True, 1)
        assert r.performs(key) == [1]  # performed once: reconciled, never re-sent


def test_a_relay_that_lost_its_connection_never_checks_with_the_token_of_its_call_in_flight():
    """The call timed out while the receiver was still working on it (its token is current
    there), and the relay thread's connection died meanwhile. Reconciled under that same token,
    the check fenced nothing: the receiver answered 404 (not performed yet), the relay called
    again with the same token, and the held call performed too -- twice. The next relay's claim
    presents a higher token; so must the relay that reconnects."""
    with fencing_receiver(hold_first=True) as r:
        key = _commit_intent({"url": f"{r.url}/hook", "check_url": f"{r.url}/check"})
        relay = Relay("relay-a", lease_seconds=LEASE)
        assert relay.pump() == 1
        wait_for(lambda: r.calls == 1, 10, "the call never reached the receiver")
        assert _terminate_other_backends() >= 1  # the relay thread's connection, mid-call

        def checked() -> bool:
            with r.lock:
                return bool(r.checks)

        wait_for(checked, 15, "the relay never reconciled its timed-out call")
        wait_for(lambda: Intent.objects.get().state != Intent.State.PERFORMING, 15, "undecided")
        r.release.set()  # the held first call's work now ends: it must be fenced out
        wait_for(lambda: r.ended == r.calls, 10, "the receiver never decided its calls")
        assert len(r.performs(key)) == 1, r.performed  # performed once, whoever performed it
        row = Intent.objects.get()
        assert row.state == Intent.State.DONE and row.claims >= 2
