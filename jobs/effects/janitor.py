"""The orphan janitor: deletes staged outputs that belong to no committed and no live attempt.

Owns: settling StagedOutput rows older than `JOBS["ORPHAN_GRACE_SECONDS"]` -- `promoted` when
their attempt committed, `orphaned` when their attempt ended any other way (expired, lost,
rejected, failed, released, cancelled: final outcomes, after which that attempt can never
commit) -- and deleting the orphans' files.

Each orphan, in this order: (1) the decision is committed (`orphaned`, `settled_at` empty) in a
short transaction of its own; (2) the file is deleted; (3) only then `settled_at` is set, the
`orphaned` event written and "orphaned output deleted" logged. A worker still writing that
output checks its row after writing (jobs/effects/staging.py): it either sees the committed
decision and deletes its own file, or wrote before the decision -- so before the janitor's
delete, which removes it. A failed delete leaves the row decided and unsettled: the next sweep
deletes again (deleting a missing file is not an error).

Never: touches an output whose attempt succeeded (a spare row, naming a file a re-stage
replaced or never got to name, is no output), or whose attempt is still `running` -- even
with its lease run out, such an attempt may still commit (a late write before any reclaim is
accepted) -- a row its own worker decided `orphaned` (a file no output names that it could not
delete, jobs/effects/staging.py) is deleted whatever its attempt. Never holds a transaction
open across a storage call. Never lists the storage bucket: it reads the StagedOutput table
through partial indexes of unsettled rows, a bounded batch per tick, so its cost follows the
number of outputs staged, not the size of the bucket.
Deletes are tried in turn (after the last one this process tried, then from the oldest), so
orphans whose delete keeps failing never hold the others back.

Hazards: two schedulers may sweep at once; rows are decided `FOR UPDATE SKIP LOCKED`, so each is
decided once, and only the janitor whose `settled_at` update changes the row reports it.
"""

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from jobs.core.conf import jobs_settings
from jobs.core.states import AttemptOutcome, EventType
from jobs.effects import staging
from jobs.models import Attempt, JobEvent, StagedOutput

logger = logging.getLogger("jobs.janitor")

BATCH = 200


def interval_seconds() -> float:
    """How often the scheduler sweeps: often enough for the grace period, at most every minute."""
    return min(60.0, max(0.2, jobs_settings().ORPHAN_GRACE_SECONDS / 2))


def _decide(limit: int) -> None:
    """Mark old unsettled outputs of finished attempts `promoted` or `orphaned` (one commit)."""
    grace = timedelta(seconds=jobs_settings().ORPHAN_GRACE_SECONDS)
    still_running = Attempt.objects.filter(
        job_id=OuterRef("job_id"), number=OuterRef("attempt"), outcome=AttemptOutcome.RUNNING
    )
    with transaction.atomic():
        rows = list(
            StagedOutput.objects.select_for_update(skip_locked=True)
            .filter(status=StagedOutput.Status.STAGED, created_at__lt=Now() - grace)
            .exclude(Exists(still_running))
            .order_by("created_at", "id")
            .values_list("pk", "job_id", "attempt", "name")[:limit]
        )
        if not rows:
            return
        committed = set(
            Attempt.objects.filter(
                job_id__in={job for _, job, _, _ in rows}, outcome=AttemptOutcome.SUCCEEDED
            ).values_list("job_id", "number")
        )
        # A spare row names a file that is no output (a re-stage's, jobs/effects/staging.py):
        # left by a worker that died or could not delete it, it is orphaned even if committed.
        promoted = [
            pk
            for pk, job, attempt, name in rows
            if (job, attempt) in committed and not name.startswith(StagedOutput.SPARE)
        ]
        kept = frozenset(promoted)
        orphaned = [pk for pk, _, _, _ in rows if pk not in kept]
        StagedOutput.objects.filter(pk__in=promoted).update(
            status=StagedOutput.Status.PROMOTED, settled_at=Now()
        )
        StagedOutput.objects.filter(pk__in=orphaned).update(status=StagedOutput.Status.ORPHANED)


_after: tuple[datetime, int] | None = None  # the last orphan this process tried to delete


def _undeleted(limit: int) -> list[StagedOutput]:
    """Up to `limit` decided orphans not yet deleted, taken in turn: those after the last one
    tried, then from the oldest. So orphans whose delete keeps failing (a permission, a key the
    storage refuses) never hold the others back: every one is tried within a few sweeps."""
    global _after
    rows = StagedOutput.objects.filter(
        status=StagedOutput.Status.ORPHANED, settled_at__isnull=True
    ).order_by("created_at", "id")
    batch: list[StagedOutput] = []
    if _after is not None:
        at, pk = _after
        after = rows.filter(Q(created_at__gt=at) | Q(pk__gt=pk), created_at__gte=at)
        batch = list(after[:limit])
    if len(batch) < limit:
        taken = {row.pk for row in batch}
        batch += [row for row in rows[: limit - len(batch)] if row.pk not in taken]
    _after = (batch[-1].created_at, batch[-1].pk) if batch else None
    return batch


def sweep(identity: str, limit: int = BATCH) -> int:
    """Decide one batch of old unsettled outputs, then delete every decided orphan's file not
    yet deleted (this batch's and any an earlier sweep could not delete); how many were deleted."""
    _decide(limit)
    undeleted = _undeleted(limit)
    st = staging.storage()
    orphans = 0
    for row in undeleted:
        try:
            st.delete(row.path)
        except Exception:  # noqa: BLE001  any backend error: deleted again by the next sweep
            logger.exception("janitor: could not delete %s (left for the next sweep)", row.path)
            continue
        with transaction.atomic():
            if not StagedOutput.objects.filter(pk=row.pk, settled_at__isnull=True).update(
                settled_at=Now()
            ):
                continue  # another janitor deleted and reported it
            age = (timezone.now() - row.created_at).total_seconds()
            JobEvent.objects.create(
                job_id=row.job_id,
                attempt=row.attempt,
                type=EventType.ORPHANED,
                worker=identity[:200],
                data={"path": row.path, "size": row.size, "age_seconds": round(age, 1)},
            )
        logger.warning(
            "orphaned output deleted: job=%s attempt=%s path=%s size=%s age=%.0fs",
            row.job_id,
            row.attempt,
            row.path,
            row.size,
            age,
        )
        orphans += 1
    return orphans
