"""Statements of the operator's transitions (requeue, cancel, retry now) and their clock.

Owns: the SQL text jobs.transitions' operator section needs beyond the ORM: the database clock as
an ORM expression, and closing the running attempt an operator took away. Never: decides.
"""

from datetime import datetime

from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.db.models.expressions import RawSQL

from jobs.sql.base import Driver


def database_now(driver: Driver) -> RawSQL:
    """The database clock (`clock_timestamp()` / SQLite's 'now') as an ORM expression."""
    return RawSQL(driver.now, ())


def close_running_attempt(
    driver: Driver, cur: CursorWrapper, job_id: int, attempt: int, outcome: str, note: str
) -> None:
    """End the attempt an operator took away; an outcome already written is kept."""
    cur.execute(
        f"UPDATE jobs_attempt SET outcome = %(outcome)s, ended_at = {driver.now}, "
        "error = CASE WHEN error = '' THEN %(note)s ELSE error END "
        "WHERE job_id = %(id)s AND number = %(attempt)s AND outcome = 'running'",
        {"id": job_id, "attempt": attempt, "outcome": outcome, "note": note},
    )


def rejection_context(
    driver: Driver, cur: CursorWrapper, job_id: int, attempt: int
) -> tuple[str, float | None]:
    """(kind, seconds since the presenting attempt's last accepted beat) for the log line."""
    cur.execute(
        f"SELECT j.kind, {driver.seconds_since('a.heartbeat_at')} FROM jobs_job j "
        "LEFT JOIN jobs_attempt a ON a.job_id = j.id AND a.number = %(attempt)s "
        "WHERE j.id = %(id)s",
        {"id": job_id, "attempt": attempt},
    )
    row = cur.fetchone()
    if row is None:
        return "", None
    return row[0], (round(float(row[1]), 3) if row[1] is not None else None)


def database_clock() -> datetime:
    """The database's time now (SQLite's is this host's clock: one host)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT clock_timestamp()")
            return cur.fetchone()[0]  # type: ignore[no-any-return]
    from django.utils import timezone

    return timezone.now()
