"""Token-checked writes to the application's own tables, and the record of any stale write
that is not a job-row write (token writes, effect completions).

Owns: `ctx.fenced_write(queryset, **values)` on models with the `jobs.models.FencedRow` mixin.
A write is accepted only while the presenting attempt is the job's *current* attempt and the job
is `running` -- an `EXISTS` on the job row inside the UPDATE itself -- and, beside it, only for
rows whose own token allows it: last written by another job (or none), or by this job at an
attempt no higher than ours (equal: an idempotent retry of the same attempt). The row's token
alone is not enough: after another job wrote the row it no longer remembers this job's attempts
(the cross-job ABA), and a row the winner never wrote carries no token of it.

All or nothing: the target rows are first locked (SELECT ... FOR UPDATE, in primary-key order
so two writers cannot deadlock), then one UPDATE decides; if it changed fewer rows than were
locked, the savepoint rolls back and nothing of the write remains. The lock comes first so the
UPDATE's snapshot is taken after every racing writer of those rows committed: its job check then
sees any reclaim those writers depended on (a zombie whose statement started before a newer
attempt committed cannot change one row and be refused on the other).

Never: reads a row into Python and saves it back; retries a refused write.

Hazards: the decision is made when the UPDATE runs. Inside the handler's own transaction the
write (like any row the handler writes) becomes visible when that transaction commits; a lease
lost in between is not re-checked at that COMMIT, so the rows keep the token of the attempt that
was current when it wrote them. `record_rejection` must not join the handler's transaction -- the
context runs it on a connection of its own -- so the record survives the handler's rollback.
"""

import logging
from dataclasses import dataclass
from typing import Any

from django.db import models, transaction
from django.db.models import Exists, Q

from jobs.core.exceptions import InvalidOption
from jobs.core.states import EventType, JobState
from jobs.core.transitions import Fence
from jobs.models import FencedRow, Job, JobEvent, RejectedWrite

logger = logging.getLogger("jobs.fencing")

# At most this many rows per call: their keys are held in memory and sent back in the UPDATE, and
# every one is locked until the write's transaction ends.
MAX_ROWS = 10_000


@dataclass(frozen=True)
class TokenDecision:
    """What one token-checked write did: all its rows updated, or none (`refused`)."""

    updated: int
    refused: bool
    resource: str  # "<app.Model>:<pk>,<pk>..." (bounded), for the record of a refusal
    attempt_current: int | None = None  # the job's attempt when refused (None: job deleted)
    state_current: str = ""


def write(fence: Fence, queryset: models.QuerySet[Any], **values: Any) -> TokenDecision:
    """Update every row of `queryset` if this attempt still owns the job, else none of them."""
    model = queryset.model
    if not issubclass(model, FencedRow):
        raise InvalidOption(
            f"fenced_write(): {model._meta.label} must use the jobs.models.FencedRow mixin"
        )
    if {"fence_job_id", "fence_attempt"} & set(values):
        raise InvalidOption("fenced_write(): the fence columns are set by the write itself")
    rows = model._default_manager.using(queryset.db)
    current = Job.objects.using(queryset.db).filter(
        pk=fence.job_id, attempt=fence.attempt, state=JobState.RUNNING
    )
    token_allows = (
        Q(fence_job_id__isnull=True)
        | ~Q(fence_job_id=fence.job_id)
        | Q(fence_attempt__lte=fence.attempt)
    )
    with transaction.atomic(using=queryset.db):
        targets = rows.filter(pk__in=queryset.values("pk")).order_by("pk")
        pks = list(targets.select_for_update().values_list("pk", flat=True)[: MAX_ROWS + 1])
        if len(pks) > MAX_ROWS:
            raise InvalidOption(f"fenced_write(): more than {MAX_ROWS} rows in one call")
        updated = (
            rows.filter(pk__in=pks)
            .filter(token_allows, Exists(current))
            .update(**values, fence_job_id=fence.job_id, fence_attempt=fence.attempt)
        )
        resource = f"{model._meta.label}:{','.join(str(pk) for pk in pks)}"[:200]
        if updated == len(pks):
            return TokenDecision(updated, False, resource)
        job = Job.objects.using(queryset.db).filter(pk=fence.job_id)
        now = job.values_list("attempt", "state").first()
        # Refused (wholly or for some row): undo whatever this UPDATE changed.
        transaction.set_rollback(True, using=queryset.db)
    attempt_current, state_current = now if now else (None, "deleted")
    return TokenDecision(0, True, resource, attempt_current, state_current)


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
