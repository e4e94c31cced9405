"""Test helpers for the wake-up: who waits (holds WAITER, jobs/core/sql/queues.py), and an
embedded scheduler run in a thread with its cluster stubbed out."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from jobs.core.sql.queues import WAITER_KEY, WAKE_LOCK_CLASS

WAITERS_SQL = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    f" AND classid = {WAKE_LOCK_CLASS}::bigint::oid AND objid = {WAITER_KEY} AND objsubid = 2"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def waiters(conn: psycopg.Connection | None = None) -> int:
    """Sessions of this database holding WAITER now, asked on `conn` or Django's connection."""
    if conn is not None:
        row = conn.execute(WAITERS_SQL).fetchone()
    else:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(WAITERS_SQL)
            row = cur.fetchone()
    assert row is not None
    return int(row[0])


class NoMaintenance:
    """The outbox relay and the janitor have nothing to do with the scheduler's ticks."""

    def __init__(self, identity: str) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@contextmanager
def scheduler_running(monkeypatch: pytest.MonkeyPatch, drains_waiting: int = 2) -> Iterator[Any]:
    """The real EmbeddedScheduler.run in a thread; its broker stubbed (`drains_waiting` drains
    already on their way, none ever requested), no maintenance thread. Yields the scheduler."""
    from jobs.worker import bridge, scheduler

    monkeypatch.setattr(scheduler, "Maintenance", NoMaintenance)
    monkeypatch.setattr(bridge, "new_broker", lambda: None)
    monkeypatch.setattr(bridge, "worker_count", lambda: 2)
    monkeypatch.setattr(bridge, "pending_drains", lambda broker: drains_waiting)
    monkeypatch.setattr(bridge, "request_drains", lambda *args: None)
    sched = scheduler.EmbeddedScheduler()
    done = threading.Event()
    thread = threading.Thread(target=sched.run, args=(done.is_set,), daemon=True)
    thread.start()
    try:
        yield sched
    finally:
        done.set()
        thread.join(10)
    assert not thread.is_alive()
