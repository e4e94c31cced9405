"""The lease reaper: reclaims running jobs whose lease ran out.

Owns: deciding, per expired job, between "queued again" and "failed" (its last attempt expired).
Never: writes without the compare-and-set in transitions.reclaim_expired, which re-checks state,
attempt and expiry inside the database -- so a commit or heartbeat that lands between our read and
our write wins, and two reapers running at once are harmless.
"""

import logging

from jobs import policy, transitions
from jobs.conf import jobs_settings
from jobs.exceptions import UnknownKind
from jobs.registry import Handler, get_handler

logger = logging.getLogger("jobs.reaper")


def reap(worker: str, limit: int = 200) -> int:
    """Reclaim up to `limit` expired leases; return how many this call reclaimed."""
    cfg = jobs_settings()
    reclaimed = 0
    for job_id, attempt, kind, max_attempts in transitions.find_expired(limit):
        try:
            handler: Handler | None = get_handler(kind)
        except UnknownKind:
            handler = None
        limit_for_job = policy.max_attempts_for(max_attempts, handler, cfg)
        decision = policy.decide_expiry(attempt, limit_for_job)
        if transitions.reclaim_expired(job_id, attempt, terminal=not decision.retry, worker=worker):
            reclaimed += 1
            logger.info(
                "job %s attempt %s: lease expired, %s",
                job_id,
                attempt,
                "requeued" if decision.retry else "failed (last attempt)",
            )
    return reclaimed
