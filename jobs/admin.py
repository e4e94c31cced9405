"""Read-only admin for jobs and attempts (actions arrive with the admin issue)."""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from jobs.models import Attempt, Job, JobEvent, RejectedWrite


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = (
        "number",
        "worker",
        "outcome",
        "claimed_at",
        "running_confirmed_at",
        "heartbeat_at",
        "ended_at",
        "error",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RejectedWriteInline(admin.TabularInline):
    model = RejectedWrite
    extra = 0
    can_delete = False
    fields = ("write", "attempt_presented", "attempt_current", "state_current", "worker", "at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "queue", "state", "attempt", "priority", "run_at", "updated_at")
    list_filter = ("state", "queue", "kind")
    search_fields = ("kind", "unique_key")
    ordering = ("-id",)
    inlines = [AttemptInline, RejectedWriteInline]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("job", "number", "worker", "outcome", "claimed_at", "ended_at")
    list_filter = ("outcome",)
    list_select_related = ("job",)


@admin.register(RejectedWrite)
class RejectedWriteAdmin(ReadOnlyAdmin):
    list_display = ("job", "write", "attempt_presented", "attempt_current", "worker", "at")
    list_filter = ("write",)


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyAdmin):
    list_display = ("job", "attempt", "type", "worker", "at")
    list_filter = ("type",)
