"""The queue controls' admin: pause, resume and limit queues (rows of jobs.QueueControl).

Owns: the screen and its actions. Never: saves a control row from a form -- every change goes
through jobs.ops.queues (validation, the operator permission of jobs.ops.actions, the audit in
LogEntry, the wake-up of a resume), so the admin's own "added"/"changed" log entries are not
written beside it. Rows are never deleted: a queue neither paused nor limited is simply active.
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs.admin.common import CheckedLookups, time_column
from jobs.models import QueueControl
from jobs.ops import actions, queues


class QueueControlForm(forms.ModelForm):
    class Meta:
        model = QueueControl
        fields = ("queue", "paused", "concurrency_limit")

    def clean_queue(self) -> str:
        name = self.cleaned_data["queue"]
        try:
            queues.validate_name(name)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return str(name)

    def clean_concurrency_limit(self) -> int | None:
        limit = self.cleaned_data["concurrency_limit"]
        try:
            queues.validate_limit(limit)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return limit  # type: ignore[no-any-return]


@admin.register(QueueControl)
class QueueControlAdmin(CheckedLookups, admin.ModelAdmin):
    form = QueueControlForm
    list_display = ("queue", "paused", "concurrency_limit", "changed", "changed_by")
    list_filter = ("paused",)
    search_fields = ("queue",)
    ordering = ("queue",)
    readonly_fields = ("changed", "changed_by")
    actions = ("pause_queues", "resume_queues", "remove_limits")
    changed = time_column("changed_at", "changed at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ("queue", *self.readonly_fields) if obj is not None else self.readonly_fields

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return bool(user.is_active and user.is_staff and user.has_perm("jobs.view_job"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return actions.may_act(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return actions.may_act(request.user)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def save_model(self, request: HttpRequest, obj: QueueControl, form: Any, change: bool) -> None:
        # Through jobs.ops.queues, never obj.save(): audited there, and a resume wakes workers.
        name = obj.queue
        if obj.paused:
            queues.pause(name, actor=request.user)
        else:
            queues.resume(name, actor=request.user)
        queues.set_limit(name, obj.concurrency_limit, actor=request.user)

    def log_addition(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        return None  # jobs.ops.queues audited each change already

    def log_change(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        return None

    def _each(self, request: HttpRequest, rows: QuerySet[QueueControl], verb: str) -> None:
        done = 0
        for name in rows.values_list("queue", flat=True):
            try:
                if verb == "pause":
                    done += queues.pause(name, actor=request.user)
                elif verb == "resume":
                    done += queues.resume(name, actor=request.user)
                else:
                    queues.set_limit(name, None, actor=request.user)
                    done += 1
            except (ValueError, PermissionError) as exc:
                self.message_user(request, f"queue {name}: {exc}", messages.ERROR)
        self.message_user(request, f"{verb}: {done} queues changed", messages.SUCCESS)

    @admin.action(description="Pause the selected queues (running jobs finish)")
    def pause_queues(self, request: HttpRequest, rows: QuerySet[QueueControl]) -> None:
        self._each(request, rows, "pause")

    @admin.action(description="Resume the selected queues (wakes their workers)")
    def resume_queues(self, request: HttpRequest, rows: QuerySet[QueueControl]) -> None:
        self._each(request, rows, "resume")

    @admin.action(description="Remove the concurrency limit of the selected queues")
    def remove_limits(self, request: HttpRequest, rows: QuerySet[QueueControl]) -> None:
        self._each(request, rows, "remove limit")
