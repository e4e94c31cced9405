"""How a job is described to an operator, the same in the admin and in `manage.py jobs`.

Owns: times to the millisecond, and the effective attempt cap and lease of a job with where each
comes from (the job's own, its handler's, or the setting). Never: writes.
"""

from datetime import datetime
from typing import Any

from django.utils import timezone

from jobs.core import policy
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import UnknownKind
from jobs.core.registry import get_handler
from jobs.models import Job


def seconds(value: datetime | None) -> str:
    """A time to the millisecond (the admin's default format stops at the minute)."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _handler_or_none(kind: str) -> Any:
    try:
        return get_handler(kind)
    except UnknownKind:
        return None


def effective_max_attempts(job: Job) -> str:
    """The cap that applies: the job's own, else its handler's, else JOBS['MAX_ATTEMPTS']."""
    handler = _handler_or_none(job.kind)
    value = policy.max_attempts_for(job.max_attempts, handler, jobs_settings())
    if job.max_attempts is not None:
        return f"{value} (job)"
    if handler is not None and handler.max_attempts is not None:
        return f"{value} (handler)"
    return f"{value} (setting)"


def effective_lease(job: Job) -> str:
    handler = _handler_or_none(job.kind)
    value = policy.lease_seconds_for(job.lease_seconds, handler, jobs_settings())
    if job.lease_seconds is not None:
        source = "job"
    elif handler is not None and handler.lease_seconds is not None:
        source = "handler"
    else:
        source = "setting"
    return f"{value:g} s ({source})"
