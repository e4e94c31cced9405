"""The lease-tuning hint: is the lease too short for the pauses the workers actually have?

Owns: reading the newest ended attempts (their longest gap between accepted heartbeats, as the
database clock measured it, and whether the lease ran out) and the newest rejected commits, and
turning them into one verdict per kind. Never: changes a lease -- it advises.

The rule: a lease must cover the longest pause a healthy worker has, with room for one more
heartbeat interval. If an attempt that did *not* expire still went more than half its lease
without a beat, the next slightly longer pause will cost the lease (and the work). If attempts
expired after silences shorter than three leases and commits were rejected, a longer lease would
have kept that work; silences far beyond the lease are stalls or kills that no lease should
cover -- fencing is what handles those. A rescued attempt (its worker process seen dead, the job
reclaimed at once by jobs.worker.rescue) also ends `expired` after a short silence, but no lease
would have kept it: it is counted apart and never taken as evidence either way.
"""

from collections import defaultdict
from dataclasses import dataclass

from django.db import connection

from jobs.core import policy
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import UnknownKind
from jobs.core.registry import get_handler
from jobs.core.sql import metrics as sql

RECENT_ATTEMPTS = 10_000


@dataclass(frozen=True)
class LeaseHint:
    kind: str
    lease_seconds: float
    attempts: int
    expired: int
    rejected_commits: int
    gap_p99: float | None  # of attempts that did not expire
    gap_max: float | None  # of attempts that did not expire
    near_miss_expiries: int  # expired after a silence shorter than three leases
    too_short: bool
    advice: str
    rescued: int = 0  # expired because the worker process died (in `expired`, not in `near`)


@dataclass(frozen=True)
class Seen:
    """One ended attempt as the hint reads it."""

    lease: float
    outcome: str
    gap: float | None  # its longest silence between accepted beats (database clock)
    rescued: bool  # expired because its worker process died, not because its lease ran out


def _lease(kind: str, job_lease: float | None) -> float:
    try:
        handler = get_handler(kind)
    except UnknownKind:
        handler = None
    return policy.lease_seconds_for(job_lease, handler, jobs_settings())


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lease_hints(limit: int = RECENT_ATTEMPTS) -> list[LeaseHint]:
    with connection.cursor() as cur:
        rows = sql.recent_attempts(connection.vendor, cur, limit)
        cur.execute(
            "SELECT j.kind, COUNT(*) FROM (SELECT job_id FROM jobs_rejectedwrite "
            "WHERE write = 'commit' ORDER BY id DESC LIMIT %s) r "
            "JOIN jobs_job j ON j.id = r.job_id GROUP BY j.kind",
            [limit],
        )
        rejected = dict(cur.fetchall())
    by_kind: dict[str, list[Seen]] = defaultdict(list)
    for kind, job_lease, outcome, gap, rescued in rows:
        by_kind[kind].append(Seen(_lease(kind, job_lease), outcome, gap, bool(rescued)))
    return [
        _verdict(kind, seen, int(rejected.get(kind, 0))) for kind, seen in sorted(by_kind.items())
    ]


def _verdict(kind: str, seen: list[Seen], rejected: int) -> LeaseHint:
    lease = min(s.lease for s in seen)
    healthy = [s.gap for s in seen if s.outcome != "expired" and s.gap is not None]
    expired = [s for s in seen if s.outcome == "expired" and not s.rescued]
    rescued = sum(1 for s in seen if s.outcome == "expired" and s.rescued)
    near = sum(1 for s in expired if s.gap is not None and s.gap < 3 * s.lease)
    p99, worst = _percentile(healthy, 0.99), max(healthy) if healthy else None
    advice, too_short = "", False
    if worst is not None and worst > lease / 2:
        too_short = True
        advice = (
            f"{kind}: a worker that kept its lease still went {worst:.1f} s without a heartbeat "
            f"(p99 {p99:.1f} s) against a lease of {lease:g} s; a slightly longer pause loses "
            f"the lease and the work. Raise the lease to at least {3 * worst:.0f} s "
            "(@handler(lease_seconds=...) or JOBS_LEASE_SECONDS), or find the pause "
            "(GC, swapping, a blocking call in the heartbeat's process)."
        )
    elif near and rejected:
        too_short = True
        advice = (
            f"{kind}: {near} of {len(seen)} recent attempts expired after silences shorter than "
            f"three leases ({lease:g} s) and {rejected} commits were rejected: work was lost to "
            f"pauses a longer lease would have covered. Consider {3 * lease:g} s."
        )
    elif expired:
        advice = (
            f"{kind}: {len(expired)} expiries after long silences (stalls or kills); a longer "
            "lease would not have saved them: fencing rejected whatever they wrote late."
        )
    if rescued:
        died = (
            f"{rescued} attempts ended when their worker process died (rescued at once; "
            "no lease would have kept them)."
        )
        advice = f"{advice} {died}" if advice else f"{kind}: {died}"
    return LeaseHint(
        kind,
        lease,
        len(seen),
        len(expired) + rescued,
        rejected,
        p99,
        worst,
        near,
        too_short,
        advice,
        rescued,
    )
