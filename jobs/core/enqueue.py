"""Enqueue's rules: what a valid job is, decided before anything is written.

Owns: `validate()` (kind a string that fits its column, checked before it is looked up, and
known; payload storable and within JOBS['MAX_PAYLOAD_BYTES'], queue name, priority, run_at,
max_attempts, lease and unique_key within their bounds) and `fields()`, the row an enqueue inserts
(`checked()`: the row and the payload's JSON text, encoded once by the check and sent to the
database as it is). Never: writes -- the insert is `Job.objects.enqueue()`
(jobs/models/job.py), which `jobs.enqueue()` calls, inside the caller's transaction. Kept apart
from the records so the records may use these rules without the rules importing the records back.
"""

from datetime import UTC, datetime
from typing import Any

from jobs.core import bounds
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import InvalidOption, InvalidQueue
from jobs.core.registry import get_handler

QUEUE_NAME = bounds.QUEUE_NAME  # one pattern for enqueue, the settings and the task backend
# The savepoint path's tries: under READ COMMITTED each one that fails met a holder that ended
# before it was read (fast jobs under one key, many producers), so a try is progress; five
# such in a row raised DuplicateJob. Under REPEATABLE READ a try costs a savepoint, ~1 ms.
UNIQUE_KEY_TRIES = 50
UNIQUE_KEY_CONSTRAINT = "jobs_job_unique_key_live"


def validate(
    kind: str,
    payload: Any,
    queue: str,
    priority: int,
    run_at: datetime | None,
    max_attempts: int | None,
    lease_seconds: float | None,
    unique_key: str | None,
) -> str:
    """Raise a ValueError subclass for the first bad argument; return the payload's JSON text."""
    bounds.kind(kind)  # a string that fits the column, before any lookup: InvalidOption
    get_handler(kind)  # raises UnknownKind
    payload_json = bounds.json_text(payload, jobs_settings().MAX_PAYLOAD_BYTES)
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise InvalidQueue(f"queue {queue!r} must match {QUEUE_NAME.pattern}")
    bounds.priority(priority)
    if run_at is not None:
        bounds.run_at(run_at)
    if max_attempts is not None:
        bounds.max_attempts(max_attempts)
    if lease_seconds is not None:
        bounds.lease_seconds(lease_seconds)
    if unique_key is not None:
        if not isinstance(unique_key, str):
            raise InvalidOption("unique_key must be a string")
        bounds.storable_text("unique_key", unique_key, bounds.TEXT_CHARS)
    return payload_json


def fields(kind: str, payload: Any = None, **options: Any) -> dict[str, Any]:
    """Validate an enqueue's arguments and return the row to insert (ValueError subclasses)."""
    return checked(kind, payload, **options)[0]


def checked(
    kind: str,
    payload: Any = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    lease_seconds: float | None = None,
    unique_key: str | None = None,
) -> tuple[dict[str, Any], str]:
    """`fields()`, and the payload as the JSON text the check encoded."""
    if payload is None:
        payload = {}
    payload_json = validate(
        kind, payload, queue, priority, run_at, max_attempts, lease_seconds, unique_key
    )
    row: dict[str, Any] = {
        "kind": kind,
        "payload": payload,
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "lease_seconds": float(lease_seconds) if lease_seconds is not None else None,
        "unique_key": unique_key,
    }
    if run_at is not None:
        # As UTC, the same instant: Python allows a UTC offset up to 23:59, PostgreSQL refuses one
        # past 15:59 (a DataError, which aborts the caller's transaction).
        row["run_at"] = run_at.astimezone(UTC)
    return row, payload_json
