"""An operator's retry of `failed` outbox intents, from the admin and from
`manage.py jobs intents retry`.

Owns: making a `failed` intent pending again with a fresh retry horizon (`retry_since`, failures
0), its `intent_retried` event and the audit trail (Django's LogEntry, on the intent's job, with
who asked and through what). By default an intent whose last call's outcome is unknown is
reconciled before it is performed; `perform_again` skips that (the operator accepts a possible
duplicate at a target that cannot check).

Never: touches an intent that is not `failed` (pending, performing and done ones are the relay's);
processes more than MAX_ROWS per call; acts for a user without the job "change" permission.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models.functions import Now

from jobs.core.states import EventType
from jobs.models import Intent, Job, JobEvent
from jobs.ops.actions import PERMISSION, may_act

MAX_ROWS = 10_000


@dataclass
class RetryReport:
    retried: list[tuple[int, str]] = field(default_factory=list)  # (job id, key)
    skipped: int = 0  # not failed (any more), or no such intent

    def summary(self) -> str:
        return f"retried {len(self.retried)} failed intents; {self.skipped} skipped (not failed)"


def retry(ids: Iterable[int], *, user: Any, via: str, perform_again: bool = False) -> RetryReport:
    """Retry the `failed` intents among `ids` (at most MAX_ROWS), audited as `user` via `via`."""
    if not may_act(user):
        raise PermissionError(f"{user} may not retry intents (needs staff and {PERMISSION})")
    wanted = sorted(set(ids))
    if len(wanted) > MAX_ROWS:
        raise ValueError(f"at most {MAX_ROWS} intents per retry")
    report = RetryReport()
    actor = f"{user.get_username()} ({via})"[:200]
    for pk in wanted:
        with transaction.atomic():
            row = (
                Intent.objects.select_for_update()
                .filter(pk=pk, state=Intent.State.FAILED)
                .values("job_id", "attempt", "key", "outcome_unknown")
                .first()
            )
            if row is None:
                report.skipped += 1
                continue
            Intent.objects.filter(pk=pk).update(
                state=Intent.State.PENDING,
                failures=0,
                retry_since=Now(),
                next_try_at=Now(),
                lease_expires_at=None,
                outcome_unknown=row["outcome_unknown"] and not perform_again,
            )
            JobEvent.objects.create(
                job_id=row["job_id"],
                attempt=row["attempt"],
                type=EventType.INTENT_RETRIED,
                worker=actor,
                data={"key": row["key"], "perform_again": perform_again},
            )
            _audit(row["job_id"], row["key"], user, via, perform_again and row["outcome_unknown"])
        report.retried.append((row["job_id"], row["key"]))
    return report


def _audit(job_id: int, key: str, user: Any, via: str, unreconciled: bool) -> None:
    how = "performed again without reconciling" if unreconciled else "retried"
    LogEntry.objects.create(
        user_id=user.pk,
        content_type=ContentType.objects.get_for_model(Job),
        object_id=str(job_id),
        object_repr=f"job {job_id}",
        action_flag=CHANGE,
        change_message=f"intent {key} {how} ({via})"[:1000],
    )
