"""The admin: jobs, attempts, events, rejected writes, schedules -- and the operator's actions.

Owns: screens for admins and the four actions (requeue, cancel, retry now, enqueue a copy). Never:
saves a job from a form. Fenced columns (state, attempt, lease, result) are read-only everywhere;
an admin changes a job only through jobs.actions -> jobs.transitions, fenced like a worker's
write. The change page is view-only for everyone (a POST to it is refused); "add job" goes
through jobs.enqueue with its validation.

Hazards: django-q2's own admin would let a user queue tasks or schedules that bypass the job
tables; it is re-registered here read-only and labelled as transport.
"""

import json
from datetime import datetime
from typing import Any

import django_q.admin as django_q_admin  # registers django-q2's admin first; replaced below
from django import forms
from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property

from jobs import actions, bounds, policy
from jobs.conf import jobs_settings
from jobs.exceptions import EnqueueError, UnknownKind
from jobs.models import (
    Attempt,
    IdempotencyKey,
    Intent,
    Job,
    JobEvent,
    RejectedWrite,
    Schedule,
    StagedOutput,
)
from jobs.registry import _handlers, get_handler

SEARCH_PAYLOAD_ROWS = 50_000  # a payload text search looks at the newest this many jobs


def seconds(value: datetime | None) -> str:
    """A time to the millisecond (the admin's default format stops at the minute)."""
    if value is None:
        return "-"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _time_column(name: str, label: str) -> Any:
    def column(self: Any, obj: Any) -> str:
        return seconds(getattr(obj, name))

    column.short_description = label  # type: ignore[attr-defined]
    column.admin_order_field = name  # type: ignore[attr-defined]
    return column


def _handler_or_none(kind: str) -> Any:
    try:
        return get_handler(kind)
    except UnknownKind:
        return None


def effective_max_attempts(job: Job) -> str:
    """The cap that applies: the job's own, else its handler's, else JOBS['MAX_ATTEMPTS']."""
    handler = _handler_or_none(job.kind)
    value = policy.max_attempts_for(job.max_attempts, handler, jobs_settings())
    if job.max_attempts is not None:
        return f"{value} (job)"
    if handler is not None and handler.max_attempts is not None:
        return f"{value} (handler)"
    return f"{value} (setting)"


def effective_lease(job: Job) -> str:
    handler = _handler_or_none(job.kind)
    value = policy.lease_seconds_for(job.lease_seconds, handler, jobs_settings())
    if job.lease_seconds is not None:
        source = "job"
    elif handler is not None and handler.lease_seconds is not None:
        source = "handler"
    else:
        source = "setting"
    return f"{value:g} s ({source})"


class EstimatedCountPaginator(Paginator):
    """An unfiltered list of a big table counts from the planner's estimate, not count(*)."""

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if (
            isinstance(qs, QuerySet)
            and connection.vendor == "postgresql"
            and not qs.query.where
            and qs.query.combinator is None
        ):
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                    [qs.model._meta.db_table],
                )
                row = cur.fetchone()
            if row and row[0] > 100_000:  # small tables: the exact count is cheap
                return int(row[0])
        return super().count


class KindFilter(admin.SimpleListFilter):
    """Kinds from the handler registry (a DISTINCT over a million jobs is a full scan)."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(k, k) for k in sorted(_handlers)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    """Queues configured, plus those with queued jobs (an index-only scan of the queued rows)."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(jobs_settings().QUEUES or ()) | {"default"}
        names |= set(Job.objects.queued().values_list("queue", flat=True).distinct()[:200])
        return [(q, q) for q in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class ViewOnlyAdmin(admin.ModelAdmin):
    paginator = EstimatedCountPaginator

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def duration(attempt: Attempt) -> str:
    """Claim to end (or to the last heartbeat while it runs), to the millisecond."""
    end = attempt.ended_at or attempt.heartbeat_at
    if end is None or attempt.claimed_at is None:
        return "-"
    return f"{(end - attempt.claimed_at).total_seconds():.3f} s"


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = (
        "number",
        "worker",
        "outcome",
        "claimed",
        "confirmed",
        "last_heartbeat",
        "heartbeat_gap_max",
        "ended",
        "took",
        "error",
    )
    readonly_fields = fields
    ordering = ("-number",)  # newest first
    claimed = _time_column("claimed_at", "claimed at")
    confirmed = _time_column("running_confirmed_at", "confirmed running")
    last_heartbeat = _time_column("heartbeat_at", "last heartbeat")
    ended = _time_column("ended_at", "ended at")

    @admin.display(description="duration")
    def took(self, obj: Attempt) -> str:
        return duration(obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RejectedWriteInline(admin.TabularInline):
    model = RejectedWrite
    extra = 0
    can_delete = False
    fields = ("write", "attempt_presented", "attempt_current", "state_current", "worker", "when")
    readonly_fields = fields
    ordering = ("-id",)
    when = _time_column("at", "at")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class EnqueueForm(forms.ModelForm):
    """The data-safe "add job": validated exactly as jobs.enqueue validates, then enqueued."""

    kind = forms.ChoiceField(choices=())
    payload = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "cols": 80}),
        required=False,
        initial="{}",
        help_text="JSON",
    )

    class Meta:
        model = Job
        fields = (
            "kind",
            "payload",
            "queue",
            "priority",
            "run_at",
            "max_attempts",
            "lease_seconds",
            "unique_key",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = [(k, k) for k in sorted(_handlers)]  # type: ignore[attr-defined]
        self.fields["run_at"].required = False

    def clean_payload(self) -> Any:
        text = self.cleaned_data.get("payload") or "{}"
        if len(text) > jobs_settings().MAX_PAYLOAD_BYTES * 6:  # \uXXXX escapes: 6 chars a byte
            raise forms.ValidationError("payload is larger than JOBS['MAX_PAYLOAD_BYTES']")
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"not JSON: {type(exc).__name__}") from None

    def clean(self) -> dict[str, Any]:
        from jobs.enqueuer import _validate

        data = super().clean() or {}
        if self.errors:
            return data
        try:
            _validate(
                data["kind"],
                data.get("payload"),
                data.get("queue") or "default",
                data.get("priority") or 0,
                data.get("run_at"),
                data.get("max_attempts"),
                data.get("lease_seconds"),
                data.get("unique_key") or None,
            )
        except EnqueueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


def _action(name: str, label: str) -> Any:
    def run(modeladmin: "JobAdmin", request: HttpRequest, queryset: QuerySet[Job]) -> None:
        try:
            report = actions.apply(name, queryset, user=request.user, via="admin")  # type: ignore[arg-type]
        except PermissionError as exc:
            modeladmin.message_user(request, str(exc), messages.ERROR)
            return
        level = messages.SUCCESS if report.changed else messages.WARNING
        modeladmin.message_user(request, report.summary(), level)

    run.__name__ = f"{name}_jobs"
    run.short_description = label  # type: ignore[attr-defined]
    run.allowed_permissions = ("change",)  # type: ignore[attr-defined]
    return run


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "queue",
        "state",
        "attempt",
        "max_attempts_effective",
        "priority",
        "run",
        "updated",
    )
    list_filter = ("state", QueueFilter, KindFilter, "created_at", "finished_at")
    paginator = EstimatedCountPaginator
    search_fields = ("=id", "unique_key")
    search_help_text = "job id, unique key, or text in the payload (newest 50,000 jobs)"
    ordering = ("-id",)
    show_full_result_count = False
    inlines = [AttemptInline, RejectedWriteInline]
    actions = [
        _action("requeue", "Requeue (fenced; takes running jobs back from their worker)"),
        _action("cancel", "Cancel (fenced; a running worker stops at its next heartbeat)"),
        _action("retry", "Retry failed now"),
        _action("copy", "Enqueue a copy"),
    ]
    add_form = EnqueueForm
    readonly_fields = (
        "kind",
        "queue",
        "priority",
        "state",
        "attempt",
        "attempts_released",
        "max_attempts_effective",
        "lease_effective",
        "run",
        "lease_expires",
        "last_heartbeat",
        "created",
        "updated",
        "finished",
        "unique_key",
        "payload",
        "progress",
        "result",
        "result_ref",
        "error",
    )
    run = _time_column("run_at", "run at")
    lease_expires = _time_column("lease_expires_at", "lease expires")
    last_heartbeat = _time_column("heartbeat_at", "last heartbeat")
    created = _time_column("created_at", "created")
    updated = _time_column("updated_at", "updated")
    finished = _time_column("finished_at", "finished")

    @admin.display(description="max attempts")
    def max_attempts_effective(self, obj: Job) -> str:
        return effective_max_attempts(obj)

    @admin.display(description="lease")
    def lease_effective(self, obj: Job) -> str:
        return effective_lease(obj)

    def get_form(
        self, request: HttpRequest, obj: Any | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = self.add_form
            kwargs["fields"] = EnqueueForm.Meta.fields
        return super().get_form(request, obj, change, **kwargs)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [(None, {"fields": EnqueueForm.Meta.fields})]
        return super().get_fieldsets(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.readonly_fields

    def get_inlines(self, request: HttpRequest, obj: Any) -> Any:
        return [] if obj is None else self.inlines

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Actions need "change"; a job's own form never saves (the page is view-only).
        return obj is None and actions.may_act(request.user)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: bool) -> None:
        if change:  # unreachable: has_change_permission(obj) is False
            raise PermissionError("jobs change only through actions")
        from jobs.enqueuer import enqueue

        data = form.cleaned_data
        job = enqueue(
            data["kind"],
            data.get("payload"),
            queue=data.get("queue") or "default",
            priority=data.get("priority") or 0,
            run_at=data.get("run_at"),
            max_attempts=data.get("max_attempts"),
            lease_seconds=data.get("lease_seconds"),
            unique_key=data.get("unique_key") or None,
        )
        obj.pk = job.pk
        obj._state.adding = False
        if getattr(job, "duplicate", False):
            messages.warning(request, f"a live job holds that unique key: job {job.pk}")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit() and len(term) < 19:
            return queryset.filter(pk=int(term)) | queryset.filter(unique_key=term), False
        by_key = queryset.filter(unique_key=term)
        if by_key.exists():
            return by_key, False
        # Bounded: the newest SEARCH_PAYLOAD_ROWS jobs, payload cast to text (no GIN index).
        newest = Job.objects.order_by("-id").values_list("id", flat=True)[
            SEARCH_PAYLOAD_ROWS - 1 : SEARCH_PAYLOAD_ROWS
        ]
        floor = newest[0] if newest else 0
        matches = queryset.filter(pk__gte=floor).annotate(payload_text=Cast("payload", TextField()))
        return matches.filter(payload_text__icontains=term[: bounds.TEXT_CHARS]), False


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
    claimed = _time_column("claimed_at", "claimed at")
    ended = _time_column("ended_at", "ended at")

    @admin.display(description="duration")
    def took(self, obj: Attempt) -> str:
        return duration(obj)


@admin.register(RejectedWrite)
class RejectedWriteAdmin(ViewOnlyAdmin):
    list_display = ("job", "write", "attempt_presented", "attempt_current", "worker", "when")
    list_filter = ("write", "at")
    search_fields = ("=job__id", "worker")
    ordering = ("-id",)
    when = _time_column("at", "at")


@admin.register(JobEvent)
class JobEventAdmin(ViewOnlyAdmin):
    list_display = ("job", "attempt", "type", "worker", "when")
    list_filter = ("type", "at")
    search_fields = ("=job__id",)
    ordering = ("-id",)
    show_full_result_count = False
    when = _time_column("at", "at")


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ViewOnlyAdmin):
    list_display = ("key", "job", "step", "status", "attempt", "performs", "repeats", "created")
    list_filter = ("status",)
    search_fields = ("key", "=job__id")
    ordering = ("-id",)
    created = _time_column("created_at", "created")


@admin.register(StagedOutput)
class StagedOutputAdmin(ViewOnlyAdmin):
    list_display = ("path", "job", "attempt", "name", "size", "status", "created", "settled")
    list_filter = ("status", "created_at")
    search_fields = ("=job__id", "path")
    ordering = ("-id",)
    created = _time_column("created_at", "staged")
    settled = _time_column("settled_at", "settled")


@admin.register(Intent)
class IntentAdmin(ViewOnlyAdmin):
    list_display = (
        "key", "job", "attempt", "target", "state", "claims", "performs", "failures",
        "reconciled", "created", "done",
    )  # fmt: skip
    list_filter = ("state", "target", "reconciled", "created_at")
    search_fields = ("key", "=job__id")
    ordering = ("-id",)
    created = _time_column("created_at", "created")
    done = _time_column("done_at", "done")


@admin.register(Schedule)
class ScheduleAdmin(ViewOnlyAdmin):
    list_display = ("name", "kind", "cron", "timezone", "missed", "enabled", "next", "last")
    list_filter = ("enabled", "kind", "source")
    next = _time_column("next_at", "next tick")
    last = _time_column("last_tick_at", "last tick enqueued")


# -- django-q2's admin: transport, read-only ------------------------------------------------
# Its Schedule and queued-task (OrmQ) screens would create work that bypasses the job tables,
# and "resubmit" re-sends transport tasks; all of that is removed. What remains is a view of
# the transport, for debugging django-q2 itself.


def _read_only(base: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    class ReadOnlyTransport(base):  # type: ignore[valid-type,misc]
        actions: list[Any] = []

        def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

        def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

        def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
            return False

    ReadOnlyTransport.__name__ = f"ReadOnly{base.__name__}"
    return ReadOnlyTransport


for _model, _admin in list(admin.site._registry.items()):
    if _model._meta.app_label == "django_q":
        admin.site.unregister(_model)
        admin.site.register(_model, _read_only(type(_admin)))

assert django_q_admin  # imported for its registrations, replaced above
