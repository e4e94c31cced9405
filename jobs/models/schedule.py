"""The cron schedule's record (jobs/ops/cron.py writes it)."""

from django.db import models

from jobs.models.job import Job


class Schedule(models.Model):
    """A recurring job: one row per declared schedule; `next_at` is the tick not yet enqueued.

    Written only by jobs.ops.cron (a compare-and-set on `next_at`, so two schedulers enqueue each
    tick once) and by its sync from settings and @handler(cron=...).
    """

    class Missed(models.TextChoices):
        LATEST = "latest", "Run the latest missed tick once"
        ALL = "all", "Run every missed tick (bounded)"
        SKIP = "skip", "Skip missed ticks"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=100)
    cron = models.CharField(max_length=200)
    timezone = models.CharField(max_length=64, default="UTC")
    payload = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=64, default="default")
    missed = models.CharField(max_length=8, choices=Missed.choices, default=Missed.LATEST)
    enabled = models.BooleanField(default=True)
    next_at = models.DateTimeField(help_text="the next tick to enqueue (UTC)")
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL)
    ticks_enqueued = models.IntegerField(default=0)
    ticks_skipped = models.IntegerField(default=0)
    source = models.CharField(max_length=16, default="settings")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron} {self.timezone})"
