"""The records' admin screens, all view-only (but for retrying failed intents): attempts,
rejected writes, events, effects, staged outputs, intents, cron schedules.
"""

from django.contrib import admin

from jobs.admin.common import ViewOnlyAdmin, duration, time_column
from jobs.admin.transport import INTENT_ACTIONS
from jobs.models import (
    Attempt,
    IdempotencyKey,
    Intent,
    JobEvent,
    RejectedWrite,
    Schedule,
    StagedOutput,
)


@admin.register(Attempt)
class AttemptAdmin(ViewOnlyAdmin):
    list_display = (
        "job",
        "number",
        "worker",
        "outcome",
        "claimed",
        "ended",
        "took",
        "heartbeat_gap_max",
    )
    list_filter = ("outcome", "claimed_at")
    search_fields = ("=job__id", "worker")
    list_select_related = ("job",)
    ordering = ("-id",)
    show_full_result_count = False
    claimed = time_column("claimed_at", "claimed at")
    ended = time_column("ended_at", "ended at")

    @admin.display(description="duration")
    def took(self, obj: Attempt) -> str:
        return duration(obj)


@admin.register(RejectedWrite)
class RejectedWriteAdmin(ViewOnlyAdmin):
    list_display = ("job", "write", "attempt_presented", "attempt_current", "worker", "when")
    list_filter = ("write", "at")
    search_fields = ("=job__id", "worker")
    ordering = ("-id",)
    when = time_column("at", "at")


@admin.register(JobEvent)
class JobEventAdmin(ViewOnlyAdmin):
    list_display = ("job", "attempt", "type", "worker", "when")
    list_filter = ("type", "at")
    search_fields = ("=job__id",)
    ordering = ("-id",)
    show_full_result_count = False
    when = time_column("at", "at")


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ViewOnlyAdmin):
    list_display = ("key", "job", "step", "status", "attempt", "performs", "repeats", "created")
    list_filter = ("status",)
    search_fields = ("key", "=job__id")
    ordering = ("-id",)
    created = time_column("created_at", "created")


@admin.register(StagedOutput)
class StagedOutputAdmin(ViewOnlyAdmin):
    list_display = ("path", "job", "attempt", "name", "size", "status", "created", "settled")
    list_filter = ("status", "created_at")
    search_fields = ("=job__id", "path")
    ordering = ("-id",)
    created = time_column("created_at", "staged")
    settled = time_column("settled_at", "settled")


@admin.register(Intent)
class IntentAdmin(ViewOnlyAdmin):
    list_display = (
        "key", "job", "attempt", "target", "state", "claims", "performs", "failures",
        "reconciled", "created", "done",
    )  # fmt: skip
    list_filter = ("state", "target", "reconciled", "created_at")
    search_fields = ("key", "=job__id")
    ordering = ("-id",)
    created = time_column("created_at", "created")
    done = time_column("done_at", "done")
    actions = INTENT_ACTIONS  # retry failed intents (jobs/admin/transport.py), audited


@admin.register(Schedule)
class ScheduleAdmin(ViewOnlyAdmin):
    list_display = ("name", "kind", "cron", "timezone", "missed", "enabled", "next", "last")
    list_filter = ("enabled", "kind", "source")
    next = time_column("next_at", "next tick")
    last = time_column("last_tick_at", "last tick enqueued")
