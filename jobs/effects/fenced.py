"""Token-checked writes to the application's own tables, and the record of any stale write
that is not a job-row write (token writes, effect completions).

Owns: `ctx.fenced_write(queryset, **values)` on models with the `jobs.models.FencedRow` mixin.
Each row keeps the job and the highest attempt whose write it accepted; the write is one filtered
`update()` whose filter carries the fence -- accepted when the row was last written by another
job (or none), or by this job at an attempt no higher than ours (equal: an idempotent retry of the
same attempt). A lower attempt changes zero rows: the database decides, in the statement that
writes, exactly like the job commit (under READ COMMITTED a blocked UPDATE re-checks its filter
against the row a racing writer committed).

Never: reads a row into Python and saves it back; retries a refused write.

Hazards: which rows were refused is read after the update (the decision is already made, the read
only reports it). `record_rejection` must not join the handler's transaction -- the context runs
it on a connection of its own -- so the record survives the handler's rollback.
"""

import logging
from dataclasses import dataclass
from typing import Any

from django.db import models, transaction
from django.db.models import Q

from jobs.core.exceptions import InvalidOption
from jobs.core.states import EventType
from jobs.core.transitions import Fence
from jobs.models import FencedRow, Job, JobEvent, RejectedWrite

logger = logging.getLogger("jobs.fencing")


@dataclass(frozen=True)
class TokenDecision:
    updated: int
    refused: list[tuple[Any, int]]  # (pk, the higher attempt that row had accepted)
    resource: str


def write(fence: Fence, queryset: models.QuerySet[Any], **values: Any) -> TokenDecision:
    """One UPDATE of `queryset`'s rows whose token this attempt may replace."""
    model = queryset.model
    if not issubclass(model, FencedRow):
        raise InvalidOption(
            f"fenced_write(): {model._meta.label} must use the jobs.models.FencedRow mixin"
        )
    if {"fence_job_id", "fence_attempt"} & set(values):
        raise InvalidOption("fenced_write(): the fence columns are set by the write itself")
    pks = list(queryset.values_list("pk", flat=True))
    accepted = (
        Q(fence_job_id__isnull=True)
        | ~Q(fence_job_id=fence.job_id)
        | Q(fence_attempt__lte=fence.attempt)
    )
    updated = queryset.filter(accepted).update(
        **values, fence_job_id=fence.job_id, fence_attempt=fence.attempt
    )
    refused = list(
        model._default_manager.filter(
            pk__in=pks, fence_job_id=fence.job_id, fence_attempt__gt=fence.attempt
        ).values_list("pk", "fence_attempt")
    )
    label = model._meta.label
    resource = f"{label}:{','.join(str(pk) for pk, _ in refused)}"[:200]
    return TokenDecision(updated, refused, resource)


def record_rejection(fence: Fence, write_: str, resource: str, attempt_current: int) -> None:
    """Store and log a stale write to something other than the job row, like every other."""
    with transaction.atomic():
        state = Job.objects.filter(pk=fence.job_id).values_list("state", flat=True).first()
        if state is None:
            return
        RejectedWrite.objects.create(
            job_id=fence.job_id,
            attempt_presented=fence.attempt,
            attempt_current=attempt_current,
            state_current=state,
            worker=fence.worker,
            write=write_,
            resource=resource[:200],
        )
        JobEvent.objects.create(
            job_id=fence.job_id,
            attempt=fence.attempt,
            type=EventType.REJECTED,
            worker=fence.worker,
            data={
                "write": write_,
                "attempt_current": attempt_current,
                "state_current": state,
                "resource": resource[:200],
            },
        )
    logger.warning(
        "stale %s rejected: job=%s attempt_presented=%s attempt_current=%s resource=%s worker=%s",
        write_,
        fence.job_id,
        fence.attempt,
        attempt_current,
        resource,
        fence.worker,
    )
