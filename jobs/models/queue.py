"""Queue controls: one durable row per queue an operator paused or limited.

Owns: the schema of `jobs.QueueControl`. Never: changes a row itself -- jobs/ops/queues.py does
(audited); the claim statement (jobs/core/sql) reads these rows on every claim, so a pause or a
limit is cluster-wide and survives restarts: it lives in the database, not in a process.

A queue without a row is neither paused nor limited.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

# A limit is at least 1 (pause a queue to run none of it) and bounded like every outside value.
LIMIT_RANGE = (1, 100_000)


class QueueControl(models.Model):
    # The queue's name as jobs store it (jobs.core.enqueue.QUEUE_NAME: at most 64 characters).
    queue = models.CharField(max_length=64, primary_key=True)
    # Claims skip a paused queue's jobs; running ones finish.
    paused = models.BooleanField(default=False, db_default=False)
    # At most this many jobs of the queue `running` at any moment, across every cluster on the
    # database (enforced inside the claim statement); NULL: no limit.
    concurrency_limit = models.IntegerField(null=True, blank=True)
    changed_at = models.DateTimeField(db_default=Now())
    changed_by = models.CharField(max_length=200, blank=True, default="", db_default="")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency_limit__isnull=True)
                | Q(concurrency_limit__range=LIMIT_RANGE),
                name="jobs_queuecontrol_limit_range",
            ),
        ]

    def __str__(self) -> str:
        return f"queue {self.queue}"
