"""The LISTEN connection keeps every wake-up it hears, including one read during its probe."""

import select
import time

import pytest

from jobs.worker import listener

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_notify_read_during_the_liveness_probe_wakes_the_waiter(second_connection, monkeypatch):
    """The probe's `SELECT 1` reads whatever is on the socket -- a NOTIFY included -- into
    psycopg's backlog; select() on the socket then sees nothing. The waiter must still wake."""
    waker = listener.Waker()
    try:
        assert waker.wait(0.05)  # a fresh LISTEN counts as a wake-up
        conn = waker._conn
        assert conn is not None
        second_connection.execute(f"NOTIFY {listener.NOTIFY_CHANNEL}")
        # The NOTIFY is on the LISTEN socket, unread (a condition with a deadline).
        ready, _, _ = select.select([conn.fileno()], [], [], 10)
        assert ready, "the NOTIFY never reached the LISTEN connection"
        monkeypatch.setattr(listener, "LIVENESS_SECONDS", 0.0)  # the next wait probes first
        started = time.monotonic()
        woke = waker.wait(1.0)
        assert woke, "the NOTIFY read by the liveness probe was lost"
        assert time.monotonic() - started < 0.5
    finally:
        waker.close()


def test_a_quiet_probe_is_no_wake_up(monkeypatch):
    waker = listener.Waker()
    try:
        assert waker.wait(0.05)  # the fresh LISTEN
        assert waker.wait(0.05)  # registered as a waiter, past the fence
        monkeypatch.setattr(listener, "LIVENESS_SECONDS", 0.0)
        assert not waker.wait(0.1)  # probed, nothing heard
    finally:
        waker.close()
