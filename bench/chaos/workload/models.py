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


class ChaosItem(FencedRow):
    """Rows handlers insert and delete through ctx.fenced_create / fenced_bulk_create /
    fenced_delete: each attempt deletes what earlier attempts of its job left, creates its own
    `item-<k>` rows, and creates and deletes a `scratch` row (once, or each round of a long job's
    loop). So a succeeded job must end with exactly its committing attempt's items."""

    job = models.BigIntegerField()
    attempt = models.IntegerField()
    name = models.CharField(max_length=20)

    def __str__(self) -> str:
        return f"item {self.pk}: job {self.job} attempt {self.attempt} {self.name}"


class AcceptedChange(models.Model):
    """Written by a trigger on chaos_chaositem for every row an accepted INSERT or DELETE
    touched, in that statement's own snapshot: the writer (an INSERT's row token; a DELETE's
    deleters, named by fenced_delete in `palisade.fenced_deleters`) and what the job row said.
    A refused statement, or a transaction whose COMMIT was refused, is rolled back with it."""

    op = models.CharField(max_length=6)
    item_id = models.BigIntegerField()
    job_id = models.BigIntegerField(null=True)
    attempt = models.IntegerField(null=True)
    job_attempt = models.IntegerField(null=True)
    job_state = models.CharField(max_length=20, null=True)  # noqa: DJ001 - NULL: no job row
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.op} item {self.item_id} by job {self.job_id} attempt {self.attempt}"


class MessMark(models.Model):
    """Inserted only inside a transaction a "messy" handler leaves open (plain ORM, no fence):
    the worker must roll it back, so the table ends empty."""

    job = models.BigIntegerField()
    attempt = models.IntegerField()

    def __str__(self) -> str:
        return f"mess of job {self.job} attempt {self.attempt}"
