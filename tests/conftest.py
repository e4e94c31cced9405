"""Shared fixtures: a factory that plants a job in any state, and a second database connection."""

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from jobs.models import Attempt, Job
from jobs.scheduler import dedicated_connection
from jobs.states import AttemptOutcome, JobState


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
        if state == JobState.RUNNING:
            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE jobs_job SET state = 'running', "
                    "lease_expires_at = clock_timestamp() + make_interval(secs => %s) "
                    "WHERE id = %s",
                    [lease_in, job.pk],
                )
            Attempt.objects.create(
                job=job,
                number=attempt,
                worker=worker,
                claimed_at=job.created_at,
                running_confirmed_at=job.created_at if confirmed else None,
                outcome=AttemptOutcome.RUNNING,
            )
        elif state != JobState.QUEUED:
            with connection.cursor() as cur:
                cur.execute(
                    "UPDATE jobs_job SET state = %s, finished_at = clock_timestamp() WHERE id = %s",
                    [state, job.pk],
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
    """Replace the function behind a registered kind for one test."""
    from jobs.registry import Handler, _handlers

    def swap(kind: str, fn: Callable[..., Any]) -> None:
        old = _handlers[kind]
        monkeypatch.setitem(_handlers, kind, Handler(kind, fn, old.lease_seconds, old.max_attempts))

    return swap
