"""The job's admin: the list, the view-only page, "add job" through enqueue's validation, and
the operator's actions (requeue, cancel, retry now, enqueue a copy).

Never: saves a job from a form. Fenced columns (state, attempt, lease, result) are read-only
everywhere; an admin changes a job only through jobs.ops.actions -> jobs.core.transitions, fenced
like a worker's write. The change page is view-only for everyone (a POST to it is refused).
"""

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from jobs.admin.common import (
    CheckedLookups,
    EstimatedCountPaginator,
    KindFilter,
    QueueFilter,
    duration,
    json_column,
    time_column,
)
from jobs.core import bounds
from jobs.core import enqueue as enqueue_rules
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import EnqueueError
from jobs.core.registry import _handlers
from jobs.models import (
    Attempt,
    Job,
    RejectedWrite,
)
from jobs.ops import actions
from jobs.ops.describe import effective_lease, effective_max_attempts

SEARCH_PAYLOAD_ROWS = 50_000  # a payload text search looks at the newest this many jobs
INLINE_ROWS = 100  # attempts and rejected writes shown on a job's page (the newest)
JSON_COLUMNS = ("payload", "progress", "result")  # never decoded by a screen: read as text
BUTTONS = [
    ("requeue", "Requeue"),
    ("cancel", "Cancel"),
    ("retry", "Retry now"),
    ("copy", "Enqueue a copy"),
]


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
    claimed = time_column("claimed_at", "claimed at")
    confirmed = time_column("running_confirmed_at", "confirmed running")
    last_heartbeat = time_column("heartbeat_at", "last heartbeat")
    ended = time_column("ended_at", "ended at")

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
    when = time_column("at", "at")

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
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            enqueue_rules.validate(
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


class ConfirmedAttempt(forms.Form):
    """The attempt a job's confirmation named; the press is refused if the job moved on."""

    attempt = forms.IntegerField(required=False, min_value=0, max_value=2**31 - 1)


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
class JobAdmin(CheckedLookups, admin.ModelAdmin):
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
        "payload_shown",
        "progress_shown",
        "result_shown",
        "result_ref",
        "error",
    )
    change_form_template = "admin/jobs/job/change_form.html"  # the action buttons
    payload_shown = json_column(Job, "payload")
    progress_shown = json_column(Job, "progress")
    result_shown = json_column(Job, "result")
    run = time_column("run_at", "run at")
    lease_expires = time_column("lease_expires_at", "lease expires")
    last_heartbeat = time_column("heartbeat_at", "last heartbeat")
    created = time_column("created_at", "created")
    updated = time_column("updated_at", "updated")
    finished = time_column("finished_at", "finished")

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
        return [(None, {"fields": self.readonly_fields})]  # each once, formatted (no form fields)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # JSON columns are never decoded here (the page reads them as text): a raw-SQL row
        # nested past Python's limit must not turn the list or the job's page into a 500.
        return super().get_queryset(request).defer(*JSON_COLUMNS)

    def get_urls(self) -> list[URLPattern]:
        act = self.admin_site.admin_view(self.act_view)  # login, staff, CSRF
        return [
            path("<int:job_id>/act/<str:action>/", act, name="jobs_job_act"),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        buttons = BUTTONS if actions.may_act(request.user) else []
        return super().change_view(
            request, object_id, form_url, {**(extra_context or {}), "job_buttons": buttons}
        )

    def act_view(self, request: HttpRequest, job_id: int, action: str) -> HttpResponse:
        """GET: what the fence will do, and a button; POST (CSRF): do it, audited, and say so."""
        if action not in actions.ACTIONS:
            raise PermissionDenied(f"no action {action!r}")
        if not actions.may_act(request.user):
            raise PermissionDenied(f"needs staff and {actions.PERMISSION}")
        if not Job.objects.filter(pk=job_id).exists():  # no confirmation for a missing job
            self.message_user(request, f"No job {job_id}: nothing to {action}.", messages.ERROR)
            return redirect("admin:jobs_job_changelist")
        page = reverse("admin:jobs_job_change", args=[job_id])
        if request.method == "POST":
            form = ConfirmedAttempt(request.POST)
            shown = form.cleaned_data.get("attempt") if form.is_valid() else None
            user: Any = request.user
            report = actions.apply_confirmed(action, job_id, user=user, via="admin", attempt=shown)
            if not isinstance(report, int):
                level = messages.SUCCESS if report.changed else messages.WARNING
                self.message_user(request, report.summary(), level)
                return redirect(page)
            # The job moved on to another attempt since the confirmation: ask again.
            changed = f"The job changed since you looked (now attempt {report}): nothing was done."
            self.message_user(request, changed, messages.WARNING)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"{dict(BUTTONS)[action]} job {job_id}?",
            "job_id": job_id,
            "action": action,
            "note": actions.fence_note(job_id, action),
            "attempt": Job.objects.filter(pk=job_id).values_list("attempt", flat=True).first(),
            "back": page,
        }
        return TemplateResponse(request, "admin/jobs/job/act_confirm.html", context)

    def get_formset_kwargs(
        self, request: HttpRequest, obj: Any, inline: Any, prefix: str
    ) -> dict[str, Any]:
        """Each inline shows the job's newest INLINE_ROWS rows: a job with 3,000 attempts and
        5,000 rejected writes (a zombie's every beat is one) made its page 14 MB, in 36 s. The
        verbose name says so, and the record's own list has them all."""
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if obj is not None and obj.pk is not None:
            rows = inline.model._default_manager.filter(job_id=obj.pk)
            newest = rows.order_by(*(inline.ordering or ("-id",))).values("id")[:INLINE_ROWS]
            kwargs["queryset"] = kwargs["queryset"].filter(pk__in=newest)
        return kwargs

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        instances = super().get_inline_instances(request, obj)
        if obj is not None:
            for inline in instances:
                name = inline.model._meta.verbose_name_plural
                total = inline.model._default_manager.filter(job_id=obj.pk).count()
                if total > INLINE_ROWS:
                    inline.verbose_name_plural = f"{name} (the newest {INLINE_ROWS} of {total:,})"
        return instances

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
        data = form.cleaned_data
        job = Job.objects.enqueue(
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
        # isascii: str.isdigit() is true for "²" and other digits int() refuses or reads oddly.
        if term.isascii() and term.isdigit() and len(term) < 19:
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
