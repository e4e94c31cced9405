"""The context of each screen's partials, shared by the full page, the htmx swap and the push.

Owns: turning selector results into what a template needs. Never: queries of its own beyond the
selectors, writes, or anything about HTTP or websockets -- views and broadcast both call these, so
a partial always renders from the same context however it is delivered.
"""

from typing import Any

from django.http import QueryDict
from django.utils import timezone

from dashboard import selectors, timeline
from dashboard.forms import JobFilterForm


def filters_from(params: QueryDict) -> tuple[JobFilterForm, dict[str, Any]]:
    form = JobFilterForm(params)
    return form, (form.cleaned_data if form.is_valid() else {})


def overview_context() -> dict[str, Any]:
    return {"overview": selectors.overview()}


def jobs_context(params: QueryDict) -> dict[str, Any]:
    form, filters = filters_from(params)
    page = selectors.job_page(filters)
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
    }


def _without_cursor(params: QueryDict) -> str:
    first = params.copy()
    first.pop("before", None)
    return first.urlencode()


def job_context(job_id: int) -> dict[str, Any] | None:
    detail = selectors.job_detail(job_id)
    if detail is None:
        return None
    now = timezone.now()
    line = timeline.build(detail.job, detail.attempts, detail.events, detail.rejected, now)
    return {"detail": detail, "job": detail.job, "timeline": line}


def rejected_context() -> dict[str, Any]:
    rows = selectors.rejected_feed()
    expiries = selectors.expiries_for(rows)
    return {"rejected": [(r, selectors.lateness(r, expiries)) for r in rows]}


def workers_context() -> dict[str, Any]:
    return {"health": selectors.workers()}
