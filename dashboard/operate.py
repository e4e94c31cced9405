"""The queues and cron pages and their staff actions (thin views, like dashboard/views.py).

Seeing needs the dashboard's view permission (dashboard.access.viewer). Pressing needs a POST
with the CSRF token from active staff holding the write's own permission, checked again by the
function that writes and audits it (jobs.ops.queues for queues, jobs.ops.cron_controls for
schedules). The outcome comes back as a message on the page the operator pressed on; a refusal
says why and changes nothing.
"""

import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dashboard import cron, queues
from dashboard.access import can_act, can_view, viewer
from dashboard.views import kept_apart, swaps_a_part
from jobs.models import Schedule
from jobs.models.queue import LIMIT_RANGE
from jobs.ops import cron_controls
from jobs.ops import queues as queue_controls
from jobs.ops.actions import may_act

POLL_SECONDS = 5  # the pages refresh their numbers by an htmx poll, not the websocket


def _render(request: HttpRequest, template: str, partial: str, context: dict) -> HttpResponse:
    """The page, or the partial its poll asks for at the same URL (views.kept_apart)."""
    if swaps_a_part(request):
        return kept_apart(render(request, f"{template}#{partial}", context), partial=True)
    context |= {
        "poll_seconds": POLL_SECONDS,
        "can_act": can_act(request.user),  # the header's drill button
        "server_now_ms": int(time.time() * 1000),  # relative times correct for skew
    }
    return kept_apart(render(request, template, context), partial=False)


@viewer
def queues_page(request: HttpRequest) -> HttpResponse:
    page = queues.queues_page(queue_controls.controls())
    context = {
        "page": page,
        "nav": "queues",
        "can_control": may_act(request.user),
        "limit_range": LIMIT_RANGE,
    }
    return _render(request, "dashboard/queues.html", "queues", context)


@viewer
def cron_page(request: HttpRequest) -> HttpResponse:
    now, rows = cron.schedule_rows()
    context = {
        "now": now,
        "schedules": rows,
        "schedules_total": Schedule.objects.count(),
        "nav": "cron",
        "can_control": cron_controls.may_control(request.user),
    }
    return _render(request, "dashboard/cron.html", "schedules", context)


def _staff_post(allowed: Callable[[Any], bool]) -> Callable[..., Any]:
    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @require_POST
        @login_required
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not (can_view(request.user) and allowed(request.user)):
                raise PermissionDenied("this action needs staff status and its permission")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


@_staff_post(cron_controls.may_control)
def cron_action(request: HttpRequest) -> HttpResponse:
    """POST `name` (in the body: any schedule name, never part of a URL) and `action`."""
    name, action = request.POST.get("name", ""), request.POST.get("action", "")
    try:
        if action == "run":
            job = cron_controls.run_now(name, user=request.user)
            messages.success(request, f"{name}: enqueued job {job.pk}.")
        elif action in {"enable", "disable"}:
            changed = cron_controls.set_enabled(name, action == "enable", user=request.user)
            done = f"{action}d" if changed else f"was already {action}d"
            messages.success(request, f"{name}: {done}.")
        else:
            messages.error(request, f"unknown action {action!r:.80}")
    except cron_controls.ScheduleControlError as exc:
        messages.error(request, str(exc))
    return redirect("dashboard:cron")


@_staff_post(may_act)
def queue_action(request: HttpRequest) -> HttpResponse:
    """POST `name`, `action` (pause, resume, limit) and, for a limit, `limit` ("" for none).
    jobs.ops.queues checks the name, the limit and the user again, writes and audits."""
    name, action = request.POST.get("name", ""), request.POST.get("action", "")
    try:
        if action in {"pause", "resume"}:
            change = queue_controls.pause if action == "pause" else queue_controls.resume
            done = f"{action}d" if change(name, actor=request.user) else f"was already {action}d"
            messages.success(request, f"queue {name}: {done}.")
        elif action == "limit":
            limit = _limit(request.POST.get("limit", ""))
            queue_controls.set_limit(name, limit, actor=request.user)
            shown = "no limit" if limit is None else f"at most {limit} running"
            messages.success(request, f"queue {name}: {shown}.")
        else:
            messages.error(request, f"unknown action {action!r:.80}")
    except ValueError as exc:  # a bad name or limit: nothing was written
        messages.error(request, str(exc))
    return redirect("dashboard:queues")


def _limit(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 9:
        raise ValueError(f"a concurrency limit is a whole number, not {text[:20]!r}")
    return int(text)
