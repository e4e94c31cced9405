"""The records of every write path beyond the job row: the effect ledger, staged outputs, outbox
intents, and the mixin for application rows written through `ctx.fenced_write()`.

Owns: schema and constraints. Never: writes -- jobs/effects does, each write fenced by the
presenting attempt.
"""

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now

from jobs.core import lanes
from jobs.models.checks import OneOf
from jobs.models.job import Job


class IdempotencyKey(models.Model):
    """The effect ledger: one row per (job, step); key is "<job_id>:<step>", never the attempt."""

    class Status(models.TextChoices):
        STARTED = "started", "Started"
        DONE = "done", "Done"

    key = models.CharField(max_length=300, unique=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="idempotency_keys")
    step = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.STARTED)
    result = models.JSONField(null=True, blank=True)
    attempt = models.IntegerField(help_text="the attempt that performed the effect")
    repeats = models.IntegerField(default=0, help_text="deduplicated repeats")
    performs = models.IntegerField(
        default=0, db_default=0, help_text="calls of the effect (>1: re-performed, same key)"
    )
    kind = models.CharField(
        max_length=16,
        default="effect",
        db_default="effect",
        help_text='"mail" for send_mail: a re-perform is a detected (possible) duplicate',
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="jobs_idem_job_step_uniq"),
        ]

    def __str__(self) -> str:
        return self.key


class StagedOutput(models.Model):
    """One file a handler staged (jobs/effects/staging.py), recorded before it is written.

    `status` is `staged` until the file's fate is known: `promoted` (its attempt committed; set
    lazily by the janitor), `discarded` (deleted by its own worker after a rejected write) or
    `orphaned` (decided by the janitor; `settled_at` set once the file's deletion succeeded).
    Whether a `staged` row is promoted is also readable at once from its Attempt's outcome.

    A spare row (`name` starting with `~`, which no handler's name can) names a file that is no
    output: a re-stage's new file before the output's row moves onto it, or the earlier file
    after, until its worker deletes file and row. Never promoted: once its attempt is over the
    janitor orphans it, committed or not.
    """

    SPARE = "~"

    class Status(models.TextChoices):
        STAGED = "staged", "Staged"
        PROMOTED = "promoted", "Promoted"
        DISCARDED = "discarded", "Discarded by its worker"
        ORPHANED = "orphaned", "Orphaned (deleted by the janitor)"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="staged_outputs")
    attempt = models.IntegerField()
    name = models.CharField(max_length=200)
    path = models.CharField(max_length=500, help_text="the storage name written")
    size = models.BigIntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.STAGED, db_default=Status.STAGED
    )
    created_at = models.DateTimeField(db_default=Now())
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "name"], name="jobs_staged_attempt_name_uniq"
            ),
            models.CheckConstraint(
                condition=OneOf(F("status"), ["staged", "promoted", "discarded", "orphaned"]),
                name="jobs_staged_status_valid",
            ),
        ]
        indexes = [
            # The janitor walks only unsettled rows, oldest first: its cost is bounded by the
            # rows it examines, never by the size of the bucket.
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="staged"),
                name="jobs_staged_unsettled_idx",
            ),
            # Decided `orphaned`, file deletion not yet confirmed (jobs/effects/janitor.py).
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="orphaned", settled_at__isnull=True),
                name="jobs_staged_undeleted_idx",
            ),
        ]
        ordering = ["job_id", "attempt", "id"]

    def __str__(self) -> str:
        return self.path

    @classmethod
    def spare_name(cls) -> str:
        return f"{cls.SPARE}replacing-{uuid.uuid4().hex}"

    @property
    def is_spare(self) -> bool:
        return self.name.startswith(self.SPARE)


class IntentQuerySet(models.QuerySet["Intent"]):
    def bulk_create(  # type: ignore[override]  # the stubs' signature, loosened
        self, objs: Iterable["Intent"], *args: Any, **kwargs: Any
    ) -> Any:
        """Rows planted through the ORM get their lane as the commit would name it."""
        planted: Any = [obj.with_lane() for obj in objs]
        return super().bulk_create(planted, *args, **kwargs)


class Intent(models.Model):
    """An outbox row: written only by the fenced commit that ends its attempt
    (jobs/effects/outbox.py).

    The relay claims it (`claims` + 1, a lease from the database clock: the relay's own fencing
    token), performs it through its target, and marks it done fenced by that token.
    `outcome_unknown` is set before every call and cleared only by a known answer: while it is
    set the intent is reconciled, never performed again on the relay's own judgement.

    `lane` (jobs.core.lanes) is what the relay bounds calls in flight by; the commit statements
    store it, and a row planted through the ORM (`create`, `bulk_create`) gets it from its target
    and data here. The database's default '' is only for a row an older release inserts while an
    upgrade rolls out (0024 fills the rows it finds): such rows share one lane, ''.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        PERFORMING = "performing", "Performing"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="intents")
    attempt = models.IntegerField(help_text="the attempt whose commit made it durable")
    step = models.CharField(max_length=100)
    key = models.CharField(max_length=140, help_text='"<job_id>:<step>"')
    target = models.CharField(max_length=100)
    lane = models.CharField(
        max_length=lanes.MAX_LANE,
        blank=True,
        default="",
        db_default="",
        help_text="the target, with the normalised origin of data['url'] (jobs.core.lanes)",
    )
    data = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=16, choices=State.choices, default=State.PENDING, db_default=State.PENDING
    )
    claims = models.IntegerField(default=0, db_default=0, help_text="relay fencing token")
    relay = models.CharField(max_length=200, blank=True, default="", db_default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    performs = models.IntegerField(default=0, db_default=0, help_text="target calls started")
    failures = models.IntegerField(default=0, db_default=0)
    outcome_unknown = models.BooleanField(
        default=False, db_default=False, help_text="a call began whose outcome is not known"
    )
    retry_since = models.DateTimeField(
        db_default=Now(), help_text="start of the retry horizon (the commit, or an operator retry)"
    )
    next_try_at = models.DateTimeField(db_default=Now())
    reconciled = models.BooleanField(
        default=False, db_default=False, help_text="done because reconciliation found it performed"
    )
    last_error = models.TextField(blank=True, default="", db_default="")
    created_at = models.DateTimeField(db_default=Now())
    done_at = models.DateTimeField(null=True, blank=True)

    objects = IntentQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="jobs_intent_job_step_uniq"),
            models.CheckConstraint(
                condition=OneOf(F("state"), ["pending", "performing", "done", "failed"]),
                name="jobs_intent_state_valid",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_try_at", "id"],
                condition=Q(state__in=["pending", "performing"]),
                name="jobs_intent_open_idx",
            ),
            # The relay's claim leaves a full lane out by ranges around it (jobs.effects.outbox).
            models.Index(
                fields=["lane"],
                condition=Q(state__in=["pending", "performing"]),
                name="jobs_intent_open_lane_idx",
            ),
        ]
        ordering = ["job_id", "id"]

    def __str__(self) -> str:
        return f"{self.key} -> {self.target} ({self.state})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.with_lane()
        super().save(*args, **kwargs)

    def with_lane(self) -> "Intent":
        if not self.lane:
            self.lane = lanes.lane(self.target, self.data)
        return self


class FencedRow(models.Model):
    """Mixin for an application's model written by handlers through ctx.fenced_write(),
    fenced_create() and fenced_delete().

    Each row keeps the job and the highest attempt whose write it accepted; a lower attempt of
    the same job is refused by the UPDATE's own filter (jobs/effects/fenced.py).
    """

    fence_job_id = models.BigIntegerField(null=True, blank=True, editable=False)
    fence_attempt = models.IntegerField(default=0, editable=False)

    class Meta:
        abstract = True
