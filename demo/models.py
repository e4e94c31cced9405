"""The demo's own table, written by handlers through ctx.fenced_write (a token-checked write)."""

from django.db import models

from jobs.models import FencedRow


class Report(FencedRow):
    """One report per name; a stale attempt of the job writing it can never overwrite it."""

    name = models.CharField(max_length=100, unique=True)
    body = models.TextField(blank=True, default="")
    rows = models.IntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.name


class Delivery(models.Model):
    """What the demo's own webhook receiver got: one row per idempotency key (it deduplicates)."""

    key = models.CharField(max_length=140, unique=True)
    body = models.JSONField(null=True, blank=True)
    repeats = models.IntegerField(default=0)
    received_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.key
