"""Palisade's job platform: fenced workers on django-q2.

Public API: `enqueue`, `handler`, and the exceptions below. `jobs.Job` and friends live in
jobs.models (importable after Django is set up).
"""

from typing import Any

from jobs.exceptions import (
    DuplicateJob,
    EnqueueError,
    InvalidOption,
    InvalidPayload,
    InvalidQueue,
    JobsError,
    LeaseLost,
    PayloadTooLarge,
    UnknownKind,
)
from jobs.registry import handler

__all__ = [
    "DuplicateJob",
    "EnqueueError",
    "InvalidOption",
    "InvalidPayload",
    "InvalidQueue",
    "JobsError",
    "LeaseLost",
    "PayloadTooLarge",
    "UnknownKind",
    "enqueue",
    "handler",
]


def enqueue(kind: str, payload: Any = None, **options: Any) -> Any:
    """Insert a queued job inside the caller's transaction; see jobs.enqueuer.enqueue."""
    from jobs.enqueuer import enqueue as _enqueue

    return _enqueue(kind, payload, **options)
