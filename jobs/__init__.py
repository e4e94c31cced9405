"""Palisade's job platform: fenced workers on django-q2.

Public API: `enqueue`, `handler`, `JobContext` (the handler's `ctx`, for type hints) and the
exceptions below. The records (`Job` and friends) live in jobs.models, importable once Django is
set up. The code is arranged by role: jobs/core (the records' rules and the one writer),
jobs/worker (what runs inside qcluster), jobs/effects (every write path beyond the job row),
jobs/ops (the operator's tools); imports only run downward (import-linter, in bin/test).
"""

from datetime import datetime
from typing import Any

from jobs import deprecated
from jobs.core.exceptions import (
    DuplicateJob,
    EnqueueError,
    InvalidOption,
    InvalidPayload,
    InvalidQueue,
    JobsError,
    LeaseLost,
    PayloadTooLarge,
    PermanentFailure,
    UnknownKind,
)
from jobs.core.registry import handler

__all__ = [
    "DuplicateJob",
    "EnqueueError",
    "InvalidOption",
    "InvalidPayload",
    "InvalidQueue",
    "JobContext",
    "JobsError",
    "LeaseLost",
    "PayloadTooLarge",
    "PermanentFailure",
    "UnknownKind",
    "enqueue",
    "handler",
]


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
) -> Any:
    """Insert a queued job inside the caller's transaction: `Job.objects.enqueue()`.

    The options spelled out (not **options) so that help(), an editor and a misspelled option's
    TypeError all show the README's signature."""
    from jobs.models import Job  # the records need Django's app registry: imported on first use

    return Job.objects.enqueue(
        kind,
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        max_attempts=max_attempts,
        lease_seconds=lease_seconds,
        unique_key=unique_key,
    )


def __getattr__(name: str) -> Any:
    if name == "JobContext":  # on first use: the worker's modules need Django set up
        from jobs.context import JobContext

        return JobContext
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")


deprecated.install()  # old module paths (jobs.transitions, jobs.bridge, ...) for one release
