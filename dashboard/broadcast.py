"""What goes out over the websocket: change notices to the group, rendered partials to a browser.

Owns: the message types between the event tail (dashboard/live.py) and the consumers, publishing
them to the channel-layer group, and rendering the partials a browser's screen needs for a set of
changes -- the same `template#partial` and the same screens.* context the page and the htmx swap
use. Never: queries of its own (screens and selectors do that) or writes.
"""

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


class ChangeNotice(TypedDict):
    """Sent by the event tail at most every COALESCE_SECONDS, never one per event."""

    type: str  # "events.changed"
    last_event_id: int
    job_ids: list[int]
    rejected: bool
    overflow: bool


class LeaseNotice(TypedDict):
    type: str  # "leases.changed"
    leases: list[tuple[int, str, str]]  # job id, lease deadline and last heartbeat (epoch ms)


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


@dataclass
class Pending:
    """Changes a consumer has seen but not rendered yet."""

    job_ids: set[int] = field(default_factory=set)
    rejected: bool = False
    everything: bool = False

    def add(self, notice: ChangeNotice) -> None:
        self.job_ids.update(notice["job_ids"])
        self.rejected |= notice["rejected"]
        self.everything |= notice["overflow"]

    def __bool__(self) -> bool:
        return bool(self.job_ids) or self.rejected or self.everything


Swap = dict[str, str]  # {"id": element id, "html": its new outerHTML}


def _swap(element_id: str, template: str, context: dict[str, Any]) -> Swap:
    return {"id": element_id, "html": render_to_string(template, context)}


def render_swaps(screen: Screen, pending: Pending) -> list[Swap]:
    """The partials `screen` must replace after `pending` changes (sync: runs queries)."""
    if screen.page == "overview":
        return [
            _swap("overview-stats", "dashboard/overview.html#stats", screens.overview_context())
        ]
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


def _jobs_swaps(screen: Screen, pending: Pending) -> list[Swap]:
    if screen.first_page:  # new jobs appear at the top: the whole first page
        context = screens.jobs_context(QueryDict(screen.query))
        return [_swap("jobs-table", "dashboard/jobs.html#table", context)]
    changed = screen.visible if pending.everything else screen.visible & pending.job_ids
    return [
        _swap(f"job-row-{job.pk}", "dashboard/jobs.html#row", {"job": job})
        for job in selectors.jobs_by_id(sorted(changed))
    ]
