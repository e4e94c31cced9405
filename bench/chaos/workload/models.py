"""The application table the handlers write through ctx.fenced_write(), shared between jobs (so a
zombie's write can meet a row another job wrote since: the cross-job ABA), and the audit its
trigger keeps of every write the database accepted."""

from django.db import models

from jobs.models import FencedRow


class ChaosRow(FencedRow):
    body = models.CharField(max_length=100, default="")

    def __str__(self) -> str:
        return f"row {self.pk}: {self.body}"


class AcceptedWrite(models.Model):
    """Written by a trigger on chaos_chaosrow for every row an accepted UPDATE wrote (the same
    values again included), in the accepting statement's own snapshot: what the job row said
    (attempt, state) when the database accepted a token-checked write. A refused write is rolled
    back, and its rows here with it."""

    row_id = models.IntegerField()
    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    job_attempt = models.IntegerField(null=True)
    job_state = models.CharField(max_length=20, null=True)  # noqa: DJ001 - NULL: no job row
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"row {self.row_id} <- job {self.job_id} attempt {self.attempt}"
