"""Enqueue: validate, then insert a queued job inside the caller's transaction.

Owns: the application-facing way to create work. Never: commits on its own -- the row (and its
wake-up NOTIFY, sent by a database trigger) becomes visible only when the caller's transaction
commits. A duplicate `unique_key` of a live (queued or running) job returns that job.
"""

import re
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from jobs import bounds
from jobs.conf import jobs_settings
from jobs.exceptions import DuplicateJob, InvalidOption, InvalidQueue
from jobs.models import Job, JobEvent
from jobs.registry import get_handler
from jobs.states import EventType, JobState

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
UNIQUE_KEY_TRIES = 5
UNIQUE_KEY_CONSTRAINT = "jobs_job_unique_key_live"


def _validate(
    kind: str,
    payload: Any,
    queue: str,
    priority: int,
    run_at: datetime | None,
    max_attempts: int | None,
    lease_seconds: float | None,
    unique_key: str | None,
) -> None:
    get_handler(kind)  # raises UnknownKind
    bounds.json_value(payload, jobs_settings().MAX_PAYLOAD_BYTES)
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


def enqueue(
    kind: str,
    payload: Any = None,
    *,
    queue: str = "default",
    priority: int = 0,
    run_at: datetime | None = None,
    max_attempts: int | None = None,
    lease_seconds: float | None = None,
    unique_key: str | None = None,
) -> Job:
    """Create a queued job in the caller's transaction and return it.

    With `unique_key`, a live job holding the same key is returned instead of a second job
    (`job.duplicate` is then True). Invalid input raises a ValueError subclass and writes nothing.
    """
    if payload is None:
        payload = {}
    _validate(kind, payload, queue, priority, run_at, max_attempts, lease_seconds, unique_key)
    fields: dict[str, Any] = {
        "kind": kind,
        "payload": payload,
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "lease_seconds": float(lease_seconds) if lease_seconds is not None else None,
        "unique_key": unique_key,
    }
    if run_at is not None:
        fields["run_at"] = run_at
    for _ in range(UNIQUE_KEY_TRIES):
        try:
            # A savepoint, so a unique-key conflict leaves the caller's transaction usable.
            with transaction.atomic():
                job = Job.objects.create(**fields)
                JobEvent.objects.create(job=job, attempt=0, type=EventType.ENQUEUED, data={})
            job.duplicate = False  # type: ignore[attr-defined]
            return job
        except IntegrityError as exc:
            message = str(exc)
            # PostgreSQL names the constraint; SQLite names the column.
            is_key_conflict = UNIQUE_KEY_CONSTRAINT in message or "jobs_job.unique_key" in message
            if unique_key is None or not is_key_conflict:
                raise
        existing = Job.objects.filter(
            unique_key=unique_key, state__in=[JobState.QUEUED, JobState.RUNNING]
        ).first()
        if existing is not None:
            existing.duplicate = True  # type: ignore[attr-defined]
            return existing
        # The holder became terminal between our insert and our read: try the insert again.
    # Under REPEATABLE READ or SERIALIZABLE the holder can be committed yet invisible to this
    # transaction's snapshot, so neither the insert nor the read can ever succeed here.
    raise DuplicateJob(
        f"a live job holds unique_key {unique_key!r} but this transaction cannot see it "
        "(REPEATABLE READ or SERIALIZABLE snapshot); retry in a new transaction"
    )
