"""Enqueue: validate, then insert a queued job inside the caller's transaction.

Owns: the application-facing way to create work. Never: commits on its own -- the row (and its
wake-up NOTIFY, sent by a database trigger) becomes visible only when the caller's transaction
commits. A duplicate `unique_key` of a live (queued or running) job returns that job.
"""

import json
import math
import re
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.conf import jobs_settings
from jobs.exceptions import InvalidOption, InvalidPayload, InvalidQueue, PayloadTooLarge
from jobs.models import Job, JobEvent
from jobs.registry import get_handler
from jobs.states import EventType, JobState

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PRIORITY_RANGE = (-32768, 32767)
UNIQUE_KEY_CONSTRAINT = "jobs_job_unique_key_live"


def encode_payload(payload: Any, limit: int) -> None:
    """Refuse anything that is not plain JSON, or too big once encoded."""
    try:
        encoded = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
    size = len(encoded.encode())
    if size > limit:
        raise PayloadTooLarge(f"payload is {size} bytes encoded; the limit is {limit}")


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
    encode_payload(payload, jobs_settings().MAX_PAYLOAD_BYTES)
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise InvalidQueue(f"queue {queue!r} must match {QUEUE_NAME.pattern}")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidOption(f"priority must be an int, not {type(priority).__name__}")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise InvalidOption(f"priority {priority} is outside {PRIORITY_RANGE}")
    if run_at is not None and (not isinstance(run_at, datetime) or timezone.is_naive(run_at)):
        raise InvalidOption("run_at must be a timezone-aware datetime")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        raise InvalidOption("max_attempts must be a positive int")
    if lease_seconds is not None and (
        isinstance(lease_seconds, bool)
        or not isinstance(lease_seconds, int | float)
        or not math.isfinite(lease_seconds)
        or lease_seconds <= 0
    ):
        raise InvalidOption("lease_seconds must be a positive number")
    if unique_key is not None and (
        not isinstance(unique_key, str) or not 0 < len(unique_key) <= 200
    ):
        raise InvalidOption("unique_key must be a non-empty string of at most 200 characters")


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
    while True:
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
