"""The job, its attempts, its events and its rejected writes: the only truth about a job.

Owns: schema, constraints and read-only query methods. Never: changes a job's state, attempt,
lease or result -- jobs/core/transitions is the only writer of those. Creating a queued row is an
enqueue (`Job.objects.enqueue()`, below, under the rules of jobs/core/enqueue.py; or a plain
create/bulk_create/raw INSERT by the application).
"""

from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from jobs.core import bounds
from jobs.core import enqueue as enqueue_rules
from jobs.core.exceptions import DuplicateJob
from jobs.core.states import TERMINAL_STATES, AttemptOutcome, EventType, JobState, Write
from jobs.models import one_statement
from jobs.models.checks import OneOf

TERMINAL = [state for state in JobState if state in TERMINAL_STATES]  # in enum order


class JobQuerySet(models.QuerySet["Job"]):
    def queued(self) -> "JobQuerySet":
        return self.filter(state=JobState.QUEUED)

    def running(self) -> "JobQuerySet":
        return self.filter(state=JobState.RUNNING)

    def terminal(self) -> "JobQuerySet":
        return self.filter(state__in=TERMINAL)

    def due(self) -> "JobQuerySet":
        return self.queued().filter(run_at__lte=Now())

    def expired_leases(self, now: datetime | None = None) -> "JobQuerySet":
        """Running jobs whose lease ran out, compared with the database clock unless `now`."""
        return self.running().filter(lease_expires_at__lt=now if now is not None else Now())


class JobManager(models.Manager.from_queryset(JobQuerySet)):  # type: ignore[misc]
    def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        lease_seconds: float | None = None,
        unique_key: str | None = None,
    ) -> "Job":
        """Create a queued job in the caller's transaction and return it (`jobs.enqueue()`).

        Options and their checks: jobs/core/enqueue.py (`fields`). With `unique_key`, a live job
        holding the same key is returned instead of a second job (`job.duplicate` is then True).
        Invalid input raises a ValueError subclass and writes nothing. Never commits on its own:
        the row (and its wake-up NOTIFY, sent by a database trigger) becomes visible when the
        caller commits. On PostgreSQL the job and its event are one statement
        (jobs/core/sql/enqueue.py), prepared once per connection unless a pooler is in the way
        (jobs/models/prepared.py); the savepoint path below is SQLite's, and PostgreSQL's when
        that statement cannot decide (a holder its snapshot cannot see).
        """
        row, payload_json = enqueue_rules.checked(
            kind,
            payload,
            queue=queue,
            priority=priority,
            run_at=run_at,
            max_attempts=max_attempts,
            lease_seconds=lease_seconds,
            unique_key=unique_key,
        )
        conn = connections[self.db]
        if conn.vendor == "postgresql":
            job = one_statement.enqueue(
                self.model, JobEvent, conn, row, enqueue_rules.UNIQUE_KEY_CONSTRAINT, payload_json
            )
            if job is not None:
                return job  # type: ignore[return-value]
        return self._enqueue_with_savepoint(row)

    def _enqueue_with_savepoint(self, row: dict[str, Any]) -> "Job":
        unique_key = row["unique_key"]
        for _ in range(enqueue_rules.UNIQUE_KEY_TRIES):
            try:
                # A savepoint, so a unique-key conflict leaves the caller's transaction usable.
                with transaction.atomic(using=self.db):
                    job = self.create(**row)
                    JobEvent.objects.using(self.db).create(
                        job=job, attempt=0, type=EventType.ENQUEUED, data={}
                    )
                job.duplicate = False  # type: ignore[attr-defined]
                return job  # type: ignore[no-any-return]
            except IntegrityError as exc:
                message = str(exc)
                # PostgreSQL names the constraint; SQLite names the column.
                is_key_conflict = (
                    enqueue_rules.UNIQUE_KEY_CONSTRAINT in message
                    or "jobs_job.unique_key" in message
                )
                if unique_key is None or not is_key_conflict:
                    raise
            existing = self.filter(
                unique_key=unique_key, state__in=[JobState.QUEUED, JobState.RUNNING]
            ).first()
            if existing is not None:
                existing.duplicate = True
                return existing  # type: ignore[no-any-return]
            # The holder became terminal between our insert and our read: try the insert again.
        # Under REPEATABLE READ or SERIALIZABLE the holder can be committed yet invisible to this
        # transaction's snapshot, so neither the insert nor the read can ever succeed here; under
        # READ COMMITTED only holders that kept finishing between our insert and our read get here.
        raise DuplicateJob(
            f"a live job holds unique_key {unique_key!r} but this transaction did not see it in "
            f"{enqueue_rules.UNIQUE_KEY_TRIES} tries (a REPEATABLE READ or SERIALIZABLE snapshot "
            "that cannot see it, or holders that kept finishing); retry in a new transaction"
        )


class Job(models.Model):
    kind = models.CharField(max_length=100)
    payload = models.JSONField(default=dict, db_default={}, blank=True)
    queue = models.CharField(max_length=64, default="default", db_default="default")
    priority = models.SmallIntegerField(default=0, db_default=0, help_text="higher runs first")
    state = models.CharField(
        max_length=16, choices=JobState.choices, default=JobState.QUEUED, db_default=JobState.QUEUED
    )
    # The fencing token: bumped by every claim, presented by every later write.
    attempt = models.IntegerField(default=0, db_default=0)
    # Claims that did not count against max_attempts: handed back before their handler started
    # (release), or expired before a heartbeat confirmed the handler running. The attempts
    # charged are `attempt - attempts_released` (jobs.core.policy). Once non-zero, the runner
    # confirms this job's start explicitly before its handler runs, so a job that kills its worker
    # is charged from then on.
    attempts_released = models.IntegerField(default=0, db_default=0)
    # NULL: the handler's limit, else JOBS['MAX_ATTEMPTS'] (resolved by jobs.core.policy).
    max_attempts = models.IntegerField(null=True, blank=True)
    lease_seconds = models.FloatField(null=True, blank=True)
    run_at = models.DateTimeField(db_default=Now())
    # A queued job due beyond the claim horizon, kept out of jobs_job_pick_idx so that future work
    # costs the claim nothing; set by a database trigger on PostgreSQL (whatever wrote the row),
    # cleared by a claim shortly before the job is due (migration 0010, jobs/core/sql/postgres.py).
    # Always False on SQLite.
    deferred = models.BooleanField(default=False, db_default=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    progress = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    result_ref = models.CharField(max_length=500, blank=True, default="", db_default="")
    error = models.TextField(blank=True, default="", db_default="")
    # NULL, not "", means "no key": the partial unique index must ignore keyless jobs.
    unique_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobManager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=OneOf(F("state"), JobState.values), name="jobs_job_state_valid"
            ),
            models.CheckConstraint(condition=Q(attempt__gte=0), name="jobs_job_attempt_nonneg"),
            models.CheckConstraint(
                condition=Q(attempts_released__gte=0) & Q(attempts_released__lte=F("attempt")),
                name="jobs_job_released_within_attempts",
            ),
            # The ranges jobs.core.bounds enforces at enqueue, for rows inserted any other way too:
            # a lease that overflows the claim's interval arithmetic would fail the claim
            # statement for every drain that reaches the row.
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__range=bounds.MAX_ATTEMPTS),
                name="jobs_job_max_attempts_range",
            ),
            models.CheckConstraint(
                condition=Q(lease_seconds__isnull=True)
                | Q(lease_seconds__range=bounds.LEASE_SECONDS),
                name="jobs_job_lease_range",
            ),
            # A running job always carries a lease and has been claimed at least once.
            models.CheckConstraint(
                condition=~Q(state=JobState.RUNNING)
                | (Q(lease_expires_at__isnull=False) & Q(attempt__gte=1)),
                name="jobs_job_running_has_lease",
            ),
            # A terminal job has finished_at; a live one does not.
            models.CheckConstraint(
                condition=(OneOf(F("state"), TERMINAL) & Q(finished_at__isnull=False))
                | (~OneOf(F("state"), TERMINAL) & Q(finished_at__isnull=True)),
                name="jobs_job_finished_iff_terminal",
            ),
            models.UniqueConstraint(
                fields=["unique_key"],
                condition=Q(state__in=[JobState.QUEUED, JobState.RUNNING])
                & Q(unique_key__isnull=False),
                name="jobs_job_unique_key_live",
            ),
        ]
        indexes = [
            # Picking the next job: an index scan in claim order over queued rows due now or
            # soon (not deferred), so rows scheduled far ahead are never walked by a claim.
            models.Index(
                F("priority").desc(),
                "run_at",
                "id",
                condition=Q(state=JobState.QUEUED, deferred=False),
                name="jobs_job_pick_idx",
            ),
            # The same order within one queue: a claim while some queue is blocked (paused, or
            # at its concurrency limit) takes each other queue's next rows from here instead of
            # stepping over the blocked queue's backlog in jobs_job_pick_idx (jobs_pick, 0019).
            models.Index(
                "queue",
                F("priority").desc(),
                "run_at",
                "id",
                condition=Q(state=JobState.QUEUED, deferred=False),
                name="jobs_job_queue_pick_idx",
            ),
            # The claim's promotion of deferred rows coming within the horizon.
            models.Index(
                fields=["run_at"],
                condition=Q(state=JobState.QUEUED, deferred=True),
                name="jobs_job_deferred_idx",
            ),
            # Running jobs per queue: a queue's concurrency limit, counted inside the claim.
            models.Index(
                fields=["queue"],
                condition=Q(state=JobState.RUNNING),
                name="jobs_job_running_queue_idx",
            ),
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(state=JobState.RUNNING),
                name="jobs_job_lease_idx",
            ),
            models.Index(fields=["-updated_at"], name="jobs_job_updated_idx"),
            # Queue depth and oldest due job per queue for /metrics: an index-only scan.
            models.Index(
                fields=["queue", "run_at"],
                condition=Q(state=JobState.QUEUED),
                name="jobs_job_queue_depth_idx",
            ),
            # The dashboard's jobs-list filters, newest first (migration 0011_dashboard_indexes).
            models.Index(fields=["kind", "id"], name="jobs_job_kind_id_idx"),
            models.Index(fields=["queue", "id"], name="jobs_job_queue_id_idx"),
            models.Index(fields=["state", "id"], name="jobs_job_state_id_idx"),
            models.Index(fields=["created_at", "id"], name="jobs_job_created_id_idx"),
            # The last hour of the queues page and the overview (dashboard/queues.py): jobs that
            # finished since a moment, by queue and state, read by an index-only scan.
            models.Index(
                fields=["finished_at", "queue", "state"],
                condition=Q(finished_at__isnull=False),
                name="jobs_job_finished_idx",
            ),
            # A cron schedule's last runs (dashboard/cron.py): its jobs, newest first, without
            # reading any job that no schedule enqueued.
            models.Index(
                fields=["kind", "-id"],
                condition=Q(unique_key__startswith="schedule:"),
                name="jobs_job_schedule_runs_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}#{self.pk} ({self.state}, attempt {self.attempt})"


class Attempt(models.Model):
    """One row per claim; `number` is the attempt (fencing token) that claim produced."""

    # No index of its own on job_id: jobs_attempt_job_number_uniq (job_id, number) serves every
    # lookup by job, and each index is one more insertion per claim (migration 0016_drain). No
    # database foreign key either (migration 0017_hot_history_unconstrained): the transitions
    # write these rows from the job row their statement holds; deletes cascade in Django.
    job = models.ForeignKey(
        Job,
        on_delete=models.CASCADE,
        related_name="attempts",
        db_index=False,
        db_constraint=False,
    )
    number = models.IntegerField()
    worker = models.CharField(max_length=200, help_text="<hostname>:<pid> running the handler")
    claimed_at = models.DateTimeField()
    # When a heartbeat (or, for a job with released attempts, an explicit write before the
    # handler ran) confirmed the handler running. NULL when the attempt ended before its first
    # beat: the reaper does not charge such an expired attempt against max_attempts.
    running_confirmed_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The longest time between two accepted beats of this attempt (claim -> first beat
    # included), seconds on the database clock: what the lease had to cover (jobs.ops.metrics).
    heartbeat_gap_max = models.FloatField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(
        max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.RUNNING
    )
    staging_ref = models.CharField(max_length=500, blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            # Invariant 2: each attempt value is claimed exactly once.
            models.UniqueConstraint(fields=["job", "number"], name="jobs_attempt_job_number_uniq"),
            models.CheckConstraint(
                condition=OneOf(F("outcome"), AttemptOutcome.values),
                name="jobs_attempt_outcome_valid",
            ),
            models.CheckConstraint(condition=Q(number__gte=1), name="jobs_attempt_number_pos"),
        ]
        ordering = ["job_id", "number"]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number} ({self.outcome})"


class JobEvent(models.Model):
    """Every transition of a job, written in the same transaction; the attempt timeline."""

    # No index of its own on job_id: jobs_event_job_idx (job_id, id) serves every lookup by job
    # (migration 0016_drain). No database foreign key, like Attempt.job (migration 0017).
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    attempt = models.IntegerField()
    type = models.CharField(max_length=32, choices=EventType.choices)
    worker = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField(db_default=Now())
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job", "id"], name="jobs_event_job_idx")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}: {self.type}"


class RejectedWrite(models.Model):
    """A fenced write that changed zero rows: the evidence that fencing worked."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="rejected_writes")
    attempt_presented = models.IntegerField()
    attempt_current = models.IntegerField()
    state_current = models.CharField(max_length=16, choices=JobState.choices)
    worker = models.CharField(max_length=200)
    write = models.CharField(max_length=16, choices=Write.choices)
    # For writes to something other than the job row: what was written (e.g. "demo.Report:7").
    resource = models.CharField(max_length=200, blank=True, default="", db_default="")
    at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["job", "id"], name="jobs_rejected_job_idx")]
        ordering = ["id"]

    def __str__(self) -> str:
        return (
            f"job {self.job_id}: {self.write} by attempt {self.attempt_presented} rejected "
            f"(current {self.attempt_current})"
        )
