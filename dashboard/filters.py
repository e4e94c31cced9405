"""The jobs list's kind/queue/state/created filters, and the bound on what a page examines.

Each of kind, queue and state alone is served by its `(x, id)` index (jobs migration
0011_dashboard_indexes): the first page is one backward index scan that stops after a page,
even when nothing matches. Several filters together could still walk every row of the first
(`kind=a&queue=b` where no job of kind a ever ran on b), so such a page examines at most SCAN_ROWS
rows of one index, newest first, and says so when that left it short (selectors.job_page). The
bound is in the statement's shape -- the other filters apply to a LIMITed subquery in FROM, which
PostgreSQL cannot flatten -- not left to the planner's estimates.
"""

from typing import Any

from django.db import connection
from django.db.models import QuerySet

from jobs.models import Job

# A page filtered by more than one of kind/queue/state/created examines at most this many jobs
# of the index that drives it (newest first); a page it leaves short says so and links on.
SCAN_ROWS = 10_000
DRIVERS = ("kind", "queue", "state")  # each has an (x, id) index: jobs/migrations/0011


def filtered(filters: dict[str, Any], qs: QuerySet[Job]) -> QuerySet[Job]:
    for name in DRIVERS:
        if filters.get(name):
            qs = qs.filter(**{name: filters[name]})
    if filters.get("since"):
        qs = qs.filter(created_at__gte=filters["since"])
    if filters.get("until"):
        qs = qs.filter(created_at__lt=filters["until"])
    return qs


def driver_of(filters: dict[str, Any]) -> tuple[QuerySet[Job], str] | None:
    """The index a multi-filter page walks (at most SCAN_ROWS rows of it), or None when one
    index serves the whole filter exactly. One of kind/queue/state alone: its (x, id) index
    walked backwards stops after a page. Created-time alone, or with others: the first of
    kind/queue/state present, else the created_at index, bounded."""
    present = [n for n in DRIVERS if filters.get(n)]
    dated = bool(filters.get("since") or filters.get("until"))
    if not dated and len(present) <= 1:
        return None
    qs = Job.objects.all()
    if filters.get("before"):
        qs = qs.filter(pk__lt=filters["before"])
    if present:
        name = present[0]
        return qs.filter(**{name: filters[name]}).order_by("-id"), f"{name} = {filters[name]}"
    dates = filtered({k: filters.get(k) for k in ("since", "until")}, qs)
    return dates.order_by("-created_at", "-id"), "the created-time range"


def bounded_ids(filters: dict[str, Any]) -> list[int] | None:
    """None when one index serves the filters exactly (`driver_of`); else the ids, newest first,
    of the jobs passing kind/queue/state/created among at most SCAN_ROWS rows of the driver."""
    drive = driver_of(filters)
    if drive is None:
        return None
    scan = drive[0].values("id", "kind", "queue", "state", "created_at")[:SCAN_ROWS]
    sql, params = scan.query.sql_with_params()
    where, args = ["TRUE"], list(params)
    for name in DRIVERS:  # column names from this fixed tuple; values are parameters
        if filters.get(name):
            where.append(f"{name} = %s")
            args.append(filters[name])
    if filters.get("since"):
        where.append("created_at >= %s")
        args.append(filters["since"])
    if filters.get("until"):
        where.append("created_at < %s")
        args.append(filters["until"])
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id FROM ({sql}) AS scanned WHERE {' AND '.join(where)} ORDER BY id DESC", args
        )
        return [row[0] for row in cur.fetchall()]
