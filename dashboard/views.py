"""Thin views: check access, ask screens for a context, render the page or (htmx) its partial.

One URL answers both (the full page, and the partial an htmx swap or poll asks for), so every
such answer says `Vary: HX-Request` and a partial is never stored (`kept_apart`): the browser's
cache gave the last poll's fragment, unstyled, for the page when the operator pressed Back. A
history restore (htmx re-fetching a page it did not keep) gets the full page: htmx puts it in
place of the whole body.
"""

import time

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_cache_control, patch_vary_headers
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from dashboard import screens, selectors
from dashboard.access import actor, can_act, viewer


def _page(
    request: HttpRequest, template: str, partial: str, context: dict, live: str
) -> HttpResponse:
    if swaps_a_part(request):
        return kept_apart(render(request, f"{template}#{partial}", context), partial=True)
    context |= {
        "live_page": live,
        "last_event_id": selectors.latest_event_id(),
        "can_act": can_act(request.user),
        "server_now_ms": int(time.time() * 1000),  # the client's countdowns correct for skew
    }
    return kept_apart(render(request, template, context), partial=False)


def _htmx(request: HttpRequest) -> HtmxDetails:
    """The attribute django-htmx's HtmxMiddleware sets on every request."""
    return request.htmx  # type: ignore[attr-defined]


def swaps_a_part(request: HttpRequest) -> bool:
    """Whether to answer with the partial: an htmx request for part of the page -- not a boosted
    link, nor a history restore, whose answer htmx puts in place of the whole body."""
    htmx = _htmx(request)
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request


def kept_apart(response: HttpResponse, partial: bool) -> HttpResponse:
    """The page and its partial share a URL: caches must never give one for the other."""
    patch_vary_headers(response, ["HX-Request", "HX-History-Restore-Request"])
    if partial:
        patch_cache_control(response, no_store=True)
    return response


@viewer
def overview(request: HttpRequest) -> HttpResponse:
    return _page(
        request, "dashboard/overview.html", "stats", screens.overview_context(), "overview"
    )


@viewer
def jobs_list(request: HttpRequest) -> HttpResponse:
    context = screens.jobs_context(request.GET)
    return _page(request, "dashboard/jobs.html", "table", context, "jobs")


@viewer
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    context = screens.job_context(job_id)
    if context is None:
        raise Http404("no such job")
    return _page(request, "dashboard/job.html", "live", context, "job")


@viewer
def job_events(request: HttpRequest, job_id: int) -> HttpResponse:
    """A job's older events, a page at a time (the job page shows the newest); not live."""
    before = request.GET.get("before", "")
    if before and not (before.isascii() and before.isdigit() and len(before) <= 18):
        return HttpResponseBadRequest("before: an event id (digits) was expected")
    context = screens.job_events_context(job_id, int(before) if before else None)
    if context is None:
        raise Http404("no such job")
    context |= {"can_act": can_act(request.user), "static_page": True}
    return render(request, "dashboard/job_events.html", context)


@viewer
def rejected(request: HttpRequest) -> HttpResponse:
    return _page(request, "dashboard/rejected.html", "feed", screens.rejected_context(), "rejected")


@viewer
def workers(request: HttpRequest) -> HttpResponse:
    return _page(request, "dashboard/workers.html", "workers", screens.workers_context(), "workers")


@actor
def drill(request: HttpRequest) -> HttpResponse:
    """Stage a zombie on the local cluster; the operator is sent to the job to watch it."""
    from demo import drill as zombie_drill  # job code lives in the demo app, never in dashboard

    job_id, started = zombie_drill.start_in_background()
    if not started:
        messages.warning(request, f"A drill is already running (job {job_id}): nothing enqueued.")
    url = reverse("dashboard:job", args=[job_id])
    if _htmx(request):
        return HttpResponseClientRedirect(url)
    return redirect(url)
