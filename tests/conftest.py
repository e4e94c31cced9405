"""Shared fixtures: a factory that plants a job in any state, and a second database connection.

Two tiers share these: PostgreSQL (tests.settings, everything but tests/sqlite) and SQLite
(tests.settings_sqlite, tests/sqlite only); `pytest_ignore_collect` keeps each tier to its tests.
"""

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from jobs.core.sql import driver_for
from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job
from jobs.worker.listener import dedicated_connection

SQLITE_TIER = Path(__file__).resolve().parent / "sqlite"


def on_sqlite() -> bool:
    return settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The SQLite tier collects only tests/sqlite; the PostgreSQL tier everything else."""
    path = collection_path.resolve()
    inside = path == SQLITE_TIER or SQLITE_TIER in path.parents
    if on_sqlite():
        return None if inside or path in SQLITE_TIER.parents else True
    return True if inside else None


def database_now() -> dt.datetime:
    """The database clock (PostgreSQL's clock_timestamp(); on SQLite the host's, as stored)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {driver_for(connection.vendor).now}", {})
        value = cur.fetchone()[0]
    if isinstance(value, str):  # SQLite: UTC text, the form Django stores datetimes in
        return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)
    return value


@pytest.fixture
def make_job(db: None) -> Callable[..., Job]:
    """Plant a job row directly (no enqueue): `make_job(state="running", attempt=2, ...)`.

    Running jobs get a lease from the database clock (`lease_in` seconds, negative = expired)
    and an open Attempt row for their current attempt, whose handler a heartbeat has confirmed
    running unless `confirmed=False`.
    """

    def make(
        kind: str = "test.echo",
        state: str = JobState.QUEUED,
        attempt: int = 0,
        lease_in: float = 30.0,
        worker: str = "test-host:1",
        confirmed: bool = True,
        **fields: Any,
    ) -> Job:
        job = Job.objects.create(kind=kind, state=JobState.QUEUED, attempt=attempt, **fields)
        clock = driver_for(connection.vendor)
        if state == JobState.RUNNING:
            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE jobs_job SET state = 'running', "
                    f"lease_expires_at = {clock.later('lease')} WHERE id = %(id)s",
                    {"lease": lease_in, "id": job.pk},
                )
            planted = Attempt.objects.create(
                job=job,
                number=attempt,
                worker=worker,
                claimed_at=job.created_at,
                outcome=AttemptOutcome.RUNNING,
            )
            # Claimed on the database clock, as a claim is: on SQLite that clock has
            # milliseconds, and Python's microseconds within the same one sort after it (a
            # rescue right after could not see the attempt claimed "before" it).
            confirmed_at = clock.now if confirmed else "NULL"
            with connection.cursor() as cur:
                cur.execute(
                    f"UPDATE jobs_attempt SET claimed_at = {clock.now}, "
                    f"running_confirmed_at = {confirmed_at} WHERE id = %(id)s",
                    {"id": planted.pk},
                )
        elif state != JobState.QUEUED:
            with connection.cursor() as cur:
                cur.execute(
                    f"UPDATE jobs_job SET state = %(state)s, finished_at = {clock.now} "
                    "WHERE id = %(id)s",
                    {"state": state, "id": job.pk},
                )
        job.refresh_from_db()
        return job

    return make


def raw_connection(autocommit: bool = True) -> psycopg.Connection:
    """A psycopg connection to the test database of its own, outside Django's."""
    return dedicated_connection(autocommit)


@pytest.fixture
def second_connection(transactional_db: None) -> Iterator[psycopg.Connection]:
    """A raw psycopg connection to the test database, independent of Django's."""
    conn = raw_connection()
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def swap_handler(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, Callable[..., Any]], None]:
    """Replace the function behind a registered kind for one test (its options and hooks stay)."""
    from dataclasses import replace

    from jobs.core.registry import _handlers

    def swap(kind: str, fn: Callable[..., Any]) -> None:
        monkeypatch.setitem(_handlers, kind, replace(_handlers[kind], fn=fn))

    return swap
