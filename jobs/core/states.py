"""Job states and attempt outcomes as data, with the allowed transitions as a table.

Owns: the vocabulary of states. Never: writes anything. The database mirrors these values in CHECK
constraints (see models.py); tests/unit/test_states.py keeps both in step.
"""

from django.db import models


class JobState(models.TextChoices):
    # enqueue (or any committed INSERT) puts a job here; the reaper, a retrying fail() and a
    # release (a claimed job whose handler never started) put it back; a claim takes it out.
    QUEUED = "queued", "Queued"
    # only a claim moves a job here (attempt + 1, lease from the database clock); commit, fail,
    # the reaper's reclaim and cancel take it out, each fenced by (id, attempt, state).
    RUNNING = "running", "Running"
    # terminal: only commit() by the current attempt.
    SUCCEEDED = "succeeded", "Succeeded"
    # terminal: fail() of the last attempt, the reaper reclaiming an expired last attempt, or
    # poison() of a queued row the database refuses to claim.
    FAILED = "failed", "Failed"
    # terminal: cancel() by an operator.
    CANCELLED = "cancelled", "Cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LIVE_STATES = frozenset({JobState.QUEUED, JobState.RUNNING})

# (from, to) pairs any writer may perform. A transition missing here is a bug in the writer.
ALLOWED_TRANSITIONS: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        (JobState.QUEUED, JobState.RUNNING),  # claim
        (JobState.QUEUED, JobState.CANCELLED),  # cancel
        (JobState.QUEUED, JobState.FAILED),  # the database refused to claim the row: poisoned
        (JobState.RUNNING, JobState.SUCCEEDED),  # commit
        (JobState.RUNNING, JobState.QUEUED),  # fail with retry, reaper reclaim, release
        (JobState.RUNNING, JobState.FAILED),  # fail, last attempt; reaper on last attempt
        (JobState.RUNNING, JobState.CANCELLED),  # cancel
        (JobState.FAILED, JobState.QUEUED),  # operator requeue
        (JobState.CANCELLED, JobState.QUEUED),  # operator requeue
    }
)


def can_transition(source: JobState, target: JobState) -> bool:
    return (source, target) in ALLOWED_TRANSITIONS


class AttemptOutcome(models.TextChoices):
    """What happened to one attempt. Set once: the first final outcome stays (an attempt that
    expired and whose zombie later presented a commit reads `expired`; the rejection is a
    RejectedWrite and an event with its own time)."""

    RUNNING = "running", "Running"  # set by the claim
    SUCCEEDED = "succeeded", "Succeeded"  # its commit was accepted
    FAILED = "failed", "Failed"  # its handler raised and the failure was accepted
    REJECTED = "rejected", "Rejected"  # its commit (or failure) was stale: zero rows
    LOST = "lost", "Lost"  # a heartbeat found the lease gone; the work was discarded
    EXPIRED = "expired", "Expired"  # its lease ran out and the reaper reclaimed the job
    # handed back: unstarted, or abandoned when a stop's grace period ended (uncharged)
    RELEASED = "released", "Released"
    CANCELLED = "cancelled", "Cancelled"  # an operator cancelled the job while it ran
    REQUEUED = "requeued", "Requeued"  # an operator took the job back while it ran (ops.actions)


class EventType(models.TextChoices):
    ENQUEUED = "enqueued", "Enqueued"
    CLAIMED = "claimed", "Claimed"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    RETRY_SCHEDULED = "retry_scheduled", "Retry scheduled"
    EXPIRED = "expired", "Lease expired"
    REJECTED = "rejected", "Stale write rejected"
    LOST = "lost", "Lease lost"
    CANCELLED = "cancelled", "Cancelled"
    REQUEUED = "requeued", "Requeued"
    RELEASED = "released", "Released (handed back)"  # unstarted, or abandoned at shutdown
    POISONED = "poisoned", "Refused by the database"
    # Effects, outputs and intents (jobs/effects: keys.py, janitor.py, outbox.py).
    EFFECT_PERFORMED = "effect_performed", "Effect performed"
    EFFECT_DEDUPLICATED = "effect_deduplicated", "Effect deduplicated"
    ORPHANED = "orphaned", "Orphaned output deleted"
    INTENT_PERFORMED = "intent_performed", "Intent performed"
    INTENT_RECONCILED = "intent_reconciled", "Intent reconciled"
    INTENT_FAILED = "intent_failed", "Intent failed"
    INTENT_RETRIED = "intent_retried", "Intent retried by an operator"
    MAIL_RESENT = "mail_resent", "Mail sent again (duplicate detected)"
    # A worker gave up resolving its final write (database unreachable past the limit); written
    # when the database is back, with the outcome then read from the attempt row
    # (jobs/worker/unresolved.py).
    UNRESOLVED = "unresolved", "Outcome unknown to its worker"


class Write(models.TextChoices):
    """Which fenced write was presented; the label of jobs_stale_writes_rejected_total."""

    HEARTBEAT = "heartbeat", "Heartbeat"
    CHECKPOINT = "checkpoint", "Checkpoint"
    COMMIT = "commit", "Commit"
    FAIL = "fail", "Fail"
    RECLAIM = "reclaim", "Reaper reclaim"
    CANCEL = "cancel", "Cancel"
    RELEASE = "release", "Release"
    EFFECT = "effect", "Effect completion"  # an older attempt recording over a newer one
    TOKEN = "token_write", "Token-checked write"  # ctx.fenced_write on another table
