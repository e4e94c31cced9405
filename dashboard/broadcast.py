"""What goes out over the websocket: change notices to the group, rendered partials to a browser.

Owns: the message types between the event tail (dashboard/live.py) and the consumers, publishing
them to the channel-layer group, and rendering the partials a browser's screen needs for a set of
changes -- the same `template#partial` and the same screens.* context the page and the htmx swap
use. Never: queries of its own (screens and selectors do that) or writes.
"""

import functools
from dataclasses import dataclass, field
from typing import Any, TypedDict

from channels.layers import get_channel_layer
from django.http import QueryDict
from django.template.loader import render_to_string

from dashboard import screens, selectors

GROUP = "dashboard.live"
# A notice names up to this many changed jobs (one read of the tail holds at most as many
# events); more -- the tail fell behind -- says "overflow", and every screen re-renders.
MAX_JOB_IDS = 5_000


# What a notice says about one changed job, read by the tail after its events: id, kind, queue,
# state and created_at (epoch seconds), as the job is now -- enough for a jobs-list screen to
# decide, without a query, whether the job can be on its filtered first page.
Fact = tuple[int, str, str, str, float]


class ChangeNotice(TypedDict):
    """Sent by the event tail at most every COALESCE_SECONDS, never one per event."""

    type: str  # "events.changed"
    last_event_id: int
    job_ids: list[int]
    rejected: bool
    overflow: bool
    facts: list[Fact]  # of the job_ids still in the table (a deleted job has none)


Lease = tuple[int, str, str]


class LeaseNotice(TypedDict):
    type: str  # "leases.changed"
    leases: list[Lease]  # job id, lease deadline and last heartbeat (epoch ms)


async def publish(message: ChangeNotice | LeaseNotice) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(GROUP, dict(message))


@dataclass
class Screen:
    """What one browser is looking at, as its websocket told us."""

    page: str
    job: int | None = None
    query: str = ""
    first_page: bool = True
    visible: set[int] = field(default_factory=set)

    @functools.cached_property
    def jobs_filters(self) -> dict[str, Any] | None:
        """The jobs list's validated filters, parsed once per screen; None when they are
        invalid: such a list shows no rows, however jobs change."""
        return screens.filters_from(QueryDict(self.query))[1]


@dataclass
class Pending:
    """Changes a consumer has seen but not rendered yet."""

    job_ids: set[int] = field(default_factory=set)
    rejected: bool = False
    everything: bool = False
    facts: dict[int, Fact] = field(default_factory=dict)

    def add(self, notice: ChangeNotice) -> None:
        self.job_ids.update(notice["job_ids"])
        self.rejected |= notice["rejected"]
        self.everything |= notice["overflow"]
        self.facts.update((int(f[0]), tuple(f)) for f in notice.get("facts", ()))  # type: ignore[misc]

    def __bool__(self) -> bool:
        return bool(self.job_ids) or self.rejected or self.everything


Swap = dict[str, str]  # {"id": element id, "html": its new outerHTML}


def _swap(element_id: str, template: str, context: dict[str, Any]) -> Swap:
    return {"id": element_id, "html": render_to_string(template, context)}


def render_swaps(screen: Screen, pending: Pending) -> list[Swap]:
    """The partials `screen` must replace after `pending` changes (sync: runs queries)."""
    if screen.page == "overview":
        shared = screens.overview_context(shared=True)  # one computation per process per second
        return [_swap("overview-stats", "dashboard/overview.html#stats", shared)]
    if screen.page == "workers":
        return [_swap("workers-live", "dashboard/workers.html#workers", screens.workers_context())]
    if screen.page == "rejected" and (pending.rejected or pending.everything):
        return [_swap("rejected-feed", "dashboard/rejected.html#feed", screens.rejected_context())]
    if (
        screen.page == "job"
        and screen.job
        and (screen.job in pending.job_ids or pending.everything)
    ):
        context = screens.job_context(screen.job)
        return [_swap("job-live", "dashboard/job.html#live", context)] if context else []
    if screen.page == "jobs":
        return _jobs_swaps(screen, pending)
    return []


def matches(filters: dict[str, Any], fact: Fact) -> bool:
    """Whether a job with these facts passes the list's kind/queue/state/created filters (the
    search `q` is not decided here: see `affects`)."""
    _, kind, queue, state, created = fact
    if any(filters.get(k) and filters[k] != v for k, v in (("kind", kind), ("queue", queue))):
        return False
    if filters.get("state") and filters["state"] != state:
        return False
    since, until = filters.get("since"), filters.get("until")
    return not (since and created < since.timestamp()) and not (
        until and created >= until.timestamp()
    )


def affects(screen: Screen, pending: Pending) -> bool | None:
    """Whether `pending` can change what `screen` shows, decided in this process without a
    query: False skips the render altogether. None (a jobs list with a search among the
    candidates) leaves it to one query over the changed jobs alone (`render_swaps`)."""
    if pending.everything or screen.page in {"overview", "workers"}:
        return True
    if screen.page == "rejected":
        return pending.rejected
    if screen.page == "job":
        return screen.job is not None and screen.job in pending.job_ids
    if screen.page != "jobs":
        return True  # a screen this does not know: render_swaps decides
    if screen.visible & pending.job_ids:
        return True  # a row it shows changed (or left the filter)
    if not screen.first_page:
        return False
    filters = screen.jobs_filters
    if filters is None:
        return False  # an invalid filter shows no rows, however jobs change
    # A job without facts was deleted: on the page only if visible, handled above.
    candidates = [f for i, f in pending.facts.items() if i in pending.job_ids]
    if not any(matches(filters, f) for f in candidates):
        return False
    return None if filters.get("q") else True


def leases_for(screen: Screen, leases: list[Lease]) -> list[Lease]:
    """The lease updates `screen` can show: a jobs list's rows, a job page's job, every one on
    the other screens with countdowns (workers), none on the overview and the feed."""
    if screen.page in {"overview", "rejected"}:
        return []
    if screen.page == "job":
        return [lease for lease in leases if lease[0] == screen.job]
    if screen.page == "jobs":
        return [lease for lease in leases if lease[0] in screen.visible]
    return leases


def _jobs_swaps(screen: Screen, pending: Pending) -> list[Swap]:
    if screen.first_page:  # new jobs appear at the top: the whole first page
        filters = screen.jobs_filters
        if (
            filters is not None
            and filters.get("q")
            and not pending.everything
            and not (screen.visible & pending.job_ids)
            and not selectors.any_on_list(filters, sorted(pending.job_ids))
        ):
            return []  # none of the changed jobs is found by the search: nothing to redraw
        context = screens.jobs_context(QueryDict(screen.query))
        screen.visible = {job.pk for job in context["page"].jobs}  # what the browser now shows
        return [_swap("jobs-table", "dashboard/jobs.html#table", context)]
    changed = screen.visible if pending.everything else screen.visible & pending.job_ids
    return [
        _swap(f"job-row-{job.pk}", "dashboard/jobs.html#row", {"job": job})
        for job in selectors.jobs_by_id(sorted(changed))
    ]
