"""The orphan janitor: deletes staged outputs that belong to no committed and no live attempt.

Owns: settling StagedOutput rows older than `JOBS["ORPHAN_GRACE_SECONDS"]` -- `promoted` when
their attempt committed, `orphaned` (file deleted, reported) when their attempt ended any other
way (expired, lost, rejected, failed, released, cancelled: final outcomes, after which that
attempt can never commit).

Never: touches an output whose attempt succeeded, or whose attempt is still `running` -- even
with its lease run out, such an attempt may still commit (a late write before any reclaim is
accepted). Never lists the storage bucket: it reads the StagedOutput table through a partial
index of unsettled rows, a bounded batch per tick, so its cost follows the number of outputs
staged, not the size of the bucket.

Hazards: two schedulers may sweep at once; rows are taken `FOR UPDATE SKIP LOCKED` inside one
transaction, so each is settled by one janitor. Storage errors leave the row unsettled for the
next sweep.
"""

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef
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


def sweep(identity: str, limit: int = BATCH) -> int:
    """Settle one batch of old unsettled outputs; return how many orphans were deleted."""
    grace = timedelta(seconds=jobs_settings().ORPHAN_GRACE_SECONDS)
    still_running = Attempt.objects.filter(
        job_id=OuterRef("job_id"), number=OuterRef("attempt"), outcome=AttemptOutcome.RUNNING
    )
    orphans = 0
    with transaction.atomic():
        rows = list(
            StagedOutput.objects.select_for_update(skip_locked=True)
            .filter(status=StagedOutput.Status.STAGED, created_at__lt=Now() - grace)
            .exclude(Exists(still_running))
            .order_by("created_at", "id")[:limit]
        )
        if not rows:
            return 0
        committed = set(
            Attempt.objects.filter(
                job_id__in={r.job_id for r in rows}, outcome=AttemptOutcome.SUCCEEDED
            ).values_list("job_id", "number")
        )
        promoted = [r.pk for r in rows if (r.job_id, r.attempt) in committed]
        StagedOutput.objects.filter(pk__in=promoted).update(
            status=StagedOutput.Status.PROMOTED, settled_at=Now()
        )
        st = staging.storage()
        for row in rows:
            if (row.job_id, row.attempt) in committed:
                continue
            try:
                st.delete(row.path)
            except Exception:  # noqa: BLE001  any backend error: left for the next sweep
                logger.exception("janitor: could not delete %s", row.path)
                continue
            StagedOutput.objects.filter(pk=row.pk).update(
                status=StagedOutput.Status.ORPHANED, settled_at=Now()
            )
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
