"""Statements of the operator's transitions (requeue, cancel, retry now) and their clock.

Owns: the SQL text of jobs/core/transitions/operator.py: lock and read a job, the fenced UPDATE
of its row, closing the running attempt an operator took away; and the database clock (as an ORM
expression for the screens, and as a value). Never: decides.
"""

from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from typing import Any

from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.db.models.expressions import RawSQL

from jobs.core.sql.base import Driver

# Values of an operator's plan that are SQL, not data: the database clock, the job's own attempt.
CLOCK = object()
ATTEMPT = object()


def lock_job(driver: Driver, cur: CursorWrapper, job_id: int) -> tuple[str, int] | None:
    """(state, attempt) of the job, locked until the transaction ends; None: no such job."""
    cur.execute(
        f"SELECT state, attempt FROM jobs_job WHERE id = %(id)s{driver.lock_row}", {"id": job_id}
    )
    row = cur.fetchone()
    return (row[0], row[1]) if row is not None else None


def update_fenced(
    driver: Driver,
    cur: CursorWrapper,
    fence: tuple[int, int, str],
    values: Mapping[str, object],
    *,
    only_if_due_later: bool = False,
) -> int:
    """UPDATE the job row only while (id, attempt, state) is still `fence`; the rows changed.

    `values`: column -> value, CLOCK or ATTEMPT (column names come from the code, never a user).
    `only_if_due_later`: and only while its run_at is still ahead of the database clock.
    """
    job_id, attempt, state = fence
    params: dict[str, Any] = {"id": job_id, "attempt": attempt, "state": state}
    sets = []
    for i, (column, value) in enumerate(values.items()):
        if value is CLOCK:
            sets.append(f"{column} = {driver.now}")
        elif value is ATTEMPT:
            sets.append(f"{column} = attempt")
        else:
            params[f"v{i}"] = value.value if isinstance(value, Enum) else value
            sets.append(f"{column} = %(v{i})s")
    sets.append(f"updated_at = {driver.now}")
    where = "id = %(id)s AND attempt = %(attempt)s AND state = %(state)s"
    if only_if_due_later:
        where += f" AND run_at > {driver.now}"
    cur.execute(f"UPDATE jobs_job SET {', '.join(sets)} WHERE {where}", params)
    return cur.rowcount


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
