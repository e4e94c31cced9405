"""The context of each screen's partials, shared by the full page, the htmx swap and the push.

Owns: turning selector results into what a template needs. Never: queries of its own beyond the
selectors, writes, or anything about HTTP or websockets -- views and broadcast both call these, so
a partial always renders from the same context however it is delivered.
"""

import threading
import time
from typing import Any

from django.http import QueryDict
from django.utils import timezone

from dashboard import charts, selectors, timeline
from dashboard.forms import JobFilterForm
from jobs.core import policy
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import UnknownKind
from jobs.core.registry import Handler, get_handler
from jobs.models import Job


def filters_from(params: QueryDict) -> tuple[JobFilterForm, dict[str, Any] | None]:
    """The form and its validated filters; None when it is invalid: such a list shows no rows
    and the form's errors (jobs.html#table), never the unfiltered list."""
    form = JobFilterForm(params)
    return form, (form.cleaned_data if form.is_valid() else None)


OVERVIEW_SHARED_SECONDS = 1.0
_overview_cache: tuple[float, selectors.Overview] | None = None
_overview_lock = threading.Lock()


def overview_context(shared: bool = False) -> dict[str, Any]:
    """`shared`: pushes to many open overviews in one process reuse one computation for up to
    OVERVIEW_SHARED_SECONDS (its counts scan the job table); a page view always computes."""
    global _overview_cache
    if not shared:
        return _with_charts(selectors.overview())
    with _overview_lock:
        if (
            _overview_cache is None
            or time.monotonic() - _overview_cache[0] > OVERVIEW_SHARED_SECONDS
        ):
            _overview_cache = (time.monotonic(), selectors.overview())
        return _with_charts(_overview_cache[1])


def _with_charts(o: selectors.Overview) -> dict[str, Any]:
    """The overview and its per-minute series drawn as charts with axes (dashboard/charts.py)."""
    now = timezone.now()
    lines = (o.succeeded_per_min, o.failed_per_min, o.rejected_per_min)
    return {"overview": o, "charts": charts.overview_charts(now, *lines)}


def jobs_context(params: QueryDict) -> dict[str, Any]:
    form, filters = filters_from(params)
    params = form.kept  # the filter's own fields, none over its length: what the page echoes
    page = selectors.job_page(filters) if filters is not None else selectors.JobPage([], None)
    filters = filters or {}
    following = params.copy()
    if page.next_before:
        following["before"] = str(page.next_before)
    return {
        "form": form,
        "page": page,
        "first_page": not filters.get("before"),
        "next_query": following.urlencode() if page.next_before else "",
        "first_query": _without_cursor(params),
        "query": params.urlencode(),
        "search_window": f"{selectors.SEARCH_WINDOW:,}",
    }


def _without_cursor(params: QueryDict) -> str:
    first = params.copy()
    first.pop("before", None)
    return first.urlencode()


def job_context(job_id: int) -> dict[str, Any] | None:
    now = timezone.now()
    detail = selectors.job_detail(job_id, now)
    if detail is None:
        return None
    line = timeline.build(
        detail.job,
        detail.attempts,
        detail.events,
        detail.rejected,
        now,
        minor=detail.minor,
        lease_seconds=_lease_seconds(detail.job),
    )
    return {"detail": detail, "job": detail.job, "timeline": line}


def job_events_context(job_id: int, before: int | None) -> dict[str, Any] | None:
    job = Job.objects.filter(pk=job_id).only("id", "kind").first()
    if job is None:
        return None
    page = selectors.job_events(job_id, before)
    return {"job": job, "page": page, "first_page": before is None}


def _lease_seconds(job: Job) -> float:
    """The lease a heartbeat of this job sets, resolved as the runner resolves it."""
    try:
        handler: Handler | None = get_handler(job.kind)
    except UnknownKind:
        handler = None
    return policy.lease_seconds_for(job.lease_seconds, handler, jobs_settings())


def rejected_context() -> dict[str, Any]:
    rows = selectors.rejected_feed()
    expiries = selectors.expiries_for(rows)
    return {"rejected": [(r, selectors.lateness(r, expiries)) for r in rows]}


def workers_context() -> dict[str, Any]:
    return {"health": selectors.workers()}
