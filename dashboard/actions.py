"""The dashboard's job actions: requeue, cancel, retry now and copy, on one job or many.

Owns: who may press (staff with `jobs.change_job`, besides seeing the dashboard), the confirmation
that names what the fence will do, and the bulk run over selected rows or everything matching the
jobs list's filter -- one chunk per request, walked by a keyset cursor on `id` up to the highest
id matching when the operator confirmed, so a run reaches every matching job and the browser
shows progress between chunks. Every change goes through jobs.ops.actions (fenced transitions,
LogEntry audit per chunk). Never: writes a job itself, or trusts a count or cursor from the
browser beyond showing it back (every value is bounded by a form).
"""

import json
from collections import Counter
from collections.abc import Callable
from functools import wraps
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Max, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.access import can_view
from dashboard.forms import JobFilterForm
from dashboard.views import kept_apart, swaps_a_part
from jobs.core.states import JobState
from jobs.models import Job
from jobs.ops import actions

View = Callable[..., HttpResponse]
LABELS = {"requeue": "Requeue", "cancel": "Cancel", "retry": "Retry now", "copy": "Copy"}
MAX_SELECTED = 1_000  # rows an operator can tick (pages of 50); a filter reaches any number
MAX_REASONS = 50  # distinct skip reasons carried between chunks
MAX_COUNT = 2**63 - 1  # a count carried between chunks: a bigint, like the form's other numbers
CHUNK_ROWS = actions.CHUNK_ROWS


def may_press(user: Any) -> bool:
    return can_view(user) and actions.may_act(user)


def job_actor(view: View) -> View:
    """Seeing the dashboard, staff and `jobs.change_job`; POSTs carry CSRF (the middleware)."""

    @login_required
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not may_press(request.user):
            raise PermissionDenied("job actions need staff status and jobs.change_job")
        return view(request, *args, **kwargs)

    return wrapped


def _htmx(request: HttpRequest) -> bool:
    return bool(getattr(request, "htmx", False))


class JobActionForm(forms.Form):
    attempt = forms.IntegerField(required=False, min_value=0, max_value=2**31 - 1)


@require_http_methods(["GET", "POST"])
@job_actor
def job_action(request: HttpRequest, job_id: int, action: str) -> HttpResponse:
    """GET: the confirmation (what the fence will do). POST: do it, audited; the outcome inline."""
    if action not in actions.ACTIONS:
        raise PermissionDenied(f"no action {action!r}")
    job = Job.objects.filter(pk=job_id).values("attempt", "state").first()
    context: dict[str, Any] = {"job_id": job_id, "action": action, "label": LABELS[action]}
    if job is None:
        return render(request, "dashboard/actions.html#outcome", context | {"text": "no such job"})
    form = JobActionForm(request.POST)
    confirmed = request.method == "POST" and form.is_valid()
    report: actions.Report | int | None = None
    if confirmed:  # decided under the row lock: the job may move on while this request runs
        shown = form.cleaned_data.get("attempt")
        user: Any = request.user
        report = actions.apply_confirmed(action, job_id, user=user, via="dashboard", attempt=shown)
    if isinstance(report, int):
        context["changed"] = f"The job changed since you looked (now attempt {report})."
        job["attempt"] = report
    if not isinstance(report, actions.Report):
        note = actions.fence_note(job_id, action)
        context |= {"note": note, "attempt": job["attempt"], "mode": "confirm"}
        partial = swaps_a_part(request)  # the same URL is the button's href: the page without JS
        template = "dashboard/actions.html" + ("#confirm" if partial else "")
        return kept_apart(render(request, template, context), partial=partial)
    done = report.changed[0] if report.changed else None
    if done is None:
        text = f"{LABELS[action]}: nothing changed ({next(iter(report.skipped), 'skipped')})"
    elif done.new_job_id:
        text = f"Copied as job {done.new_job_id}."
    else:
        text = f"{LABELS[action]}: {done.reason} (fenced by attempt {done.attempt})."
    context |= {"text": text, "changed": bool(done), "new_job_id": done and done.new_job_id}
    if _htmx(request):
        return render(request, "dashboard/actions.html#outcome", context)
    messages.info(request, text)
    return redirect(reverse("dashboard:job", args=[job_id]))


# -- many jobs ------------------------------------------------------------------------------------


class BulkForm(JobFilterForm):
    """The filter of the jobs list, plus what to do and how far a run has got."""

    action = forms.ChoiceField(choices=[(a, LABELS[a]) for a in actions.ACTIONS])
    scope = forms.ChoiceField(choices=[("selected", "selected"), ("matching", "matching")])
    ids = forms.CharField(required=False, max_length=MAX_SELECTED * 20)
    step = forms.ChoiceField(choices=[("confirm", "confirm"), ("run", "run")])
    after = forms.IntegerField(required=False, min_value=0, max_value=MAX_COUNT)
    upto = forms.IntegerField(required=False, min_value=0, max_value=MAX_COUNT)
    total = forms.IntegerField(required=False, min_value=0, max_value=MAX_COUNT)
    changed = forms.IntegerField(required=False, min_value=0, max_value=MAX_COUNT)
    skipped = forms.CharField(required=False, max_length=20_000)

    def clean_ids(self) -> list[int]:
        parts = [p for p in self.data.getlist("ids") if p] if hasattr(self.data, "getlist") else []
        text = ",".join(parts)
        if len(text) > MAX_SELECTED * 20:
            raise forms.ValidationError(f"at most {MAX_SELECTED} selected rows")
        ids = [p.strip() for p in text.split(",") if p.strip()]
        if len(ids) > MAX_SELECTED:
            raise forms.ValidationError(f"at most {MAX_SELECTED} selected rows")
        if not all(p.isascii() and p.isdigit() and len(p) <= 18 for p in ids):
            raise forms.ValidationError("ids must be job numbers")
        return sorted({int(p) for p in ids})

    def clean_skipped(self) -> Counter[str]:
        text = self.cleaned_data.get("skipped") or "{}"
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise forms.ValidationError("not a report") from None
        if not isinstance(data, dict) or len(data) > MAX_REASONS:
            raise forms.ValidationError("not a report")
        # Bounded: Python reads integers of thousands of digits, and their sum could not even be
        # printed on the progress (str() refuses past 4,300 digits). True is no count either.
        if not all(
            isinstance(k, str) and type(v) is int and 0 <= v <= MAX_COUNT for k, v in data.items()
        ):
            raise forms.ValidationError("not a report")
        return Counter({k[:300]: v for k, v in data.items()})

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("scope") == "selected" and not data.get("ids"):
            raise forms.ValidationError("select some rows first, or choose everything matching")
        if data.get("scope") == "matching" and data.get("q"):
            raise forms.ValidationError(
                "a search cannot be acted on as a whole: select its rows, or filter by state, "
                "queue, kind and time"
            )
        return data


def _matching(data: dict[str, Any]) -> QuerySet[Job]:
    qs = Job.objects.all()
    for name in ("state", "queue", "kind"):
        if data.get(name):
            qs = qs.filter(**{name: data[name]})
    if data.get("since"):
        qs = qs.filter(created_at__gte=data["since"])
    if data.get("until"):
        qs = qs.filter(created_at__lt=data["until"])
    return qs


def _described(data: dict[str, Any]) -> str:
    if data["scope"] == "selected":
        return f"the {len(data['ids'])} selected jobs"
    parts = [f"{n}={data[n]}" for n in ("state", "queue", "kind", "since", "until") if data.get(n)]
    return "every job matching " + (", ".join(parts) if parts else "no filter (all jobs)")


@require_POST
@job_actor
def bulk(request: HttpRequest) -> HttpResponse:
    """step=confirm: count the selection and name what happens; step=run: one chunk of the run."""
    form = BulkForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(str(e) for errs in form.errors.values() for e in errs)
        return render(request, "dashboard/actions.html#bulk_error", {"error": errors})
    data = form.cleaned_data
    selection: QuerySet[Job] | list[int] = (
        data["ids"] if data["scope"] == "selected" else _matching(data)
    )
    context: dict[str, Any] = {
        "form_data": _carried(request),
        "action": data["action"],
        "label": LABELS[data["action"]],
        "described": _described(data),
        "chunk_rows": CHUNK_ROWS,
    }
    if data["step"] == "confirm":
        qs = selection if isinstance(selection, QuerySet) else Job.objects.filter(pk__in=selection)
        upto = qs.aggregate(m=Max("id"))["m"] or 0
        running = qs.filter(state=JobState.RUNNING).count()
        context |= {"total": qs.count(), "upto": upto, "running": running}
        return render(request, "dashboard/actions.html#bulk_confirm", context)
    report = actions.apply_chunk(
        data["action"],
        selection,
        user=request.user,  # type: ignore[arg-type]
        via="dashboard",
        after=data.get("after") or 0,
        upto=data.get("upto") or 0,
    )
    changed = (data.get("changed") or 0) + len(report.changed)
    skipped = data["skipped"] + report.skipped
    total = data.get("total") or 0
    processed = changed + sum(skipped.values())
    context |= {
        "total": total,
        "upto": data.get("upto") or 0,
        "after": report.last_id,
        "more": report.more,
        "changed": changed,
        "skipped": skipped.most_common(),
        "skipped_total": sum(skipped.values()),
        "skipped_json": json.dumps(dict(skipped.most_common(MAX_REASONS))),
        "processed": processed,
        "percent": min(100, processed * 100 // total) if total else 100,
    }
    return render(request, "dashboard/actions.html#bulk_progress", context)


CARRIED = ("action", "scope", "ids", "state", "queue", "kind", "since", "until")


def _carried(request: HttpRequest) -> list[tuple[str, str]]:
    """The selection's fields, posted again with every chunk (the form validated them)."""
    pairs = []
    for name in CARRIED:
        values = request.POST.getlist(name)
        if name == "ids":
            values = [",".join(v for v in values if v)]
        pairs += [(name, v) for v in values[:1] if v]
    return pairs
