"""Statements of the operator's transitions (requeue, cancel, retry now) and their clock.

Owns: the SQL text jobs.transitions' operator section needs beyond the ORM: the database clock as
an ORM expression, and closing the running attempt an operator took away. Never: decides.
"""

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
