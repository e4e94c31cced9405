"""The reaper's transitions: find leases that ran out and reclaim them (compare-and-set).

Owns: the statements jobs/worker/reaper.py decides with. Never: decides whether an expired
attempt is charged or terminal (jobs/core/policy.py and the reaper do), or records a lost race as
a stale write (the reaper holds no attempt; it counts its lost races itself).
"""

import logging
from typing import Any

from django.db import connection

from jobs.core.sql import ExpiredRow
from jobs.core.transitions.fence import driver, fenced_statement

logger = logging.getLogger("jobs.fencing")


def reclaim_expired(
    row: ExpiredRow,
    *,
    terminal: bool,
    charged: bool,
    worker: str,
    error: str = "",
    gone_for: float | None = None,
    delay: float = 0.0,
) -> bool:
    """The reaper's compare-and-set; False when a commit, beat or other reaper got there first.

    `gone_for` (a rescue, jobs.worker.rescue): the attempt's worker process was seen dead that
    many seconds ago; the row must still be that worker's open attempt, claimed before then,
    instead of past its lease.

    A lost race is not a stale write (the reaper holds no attempt), so it is not recorded as a
    rejection; the reaper counts it on its own.
    """
    with fenced_statement(), connection.cursor() as cur:
        won = driver().reclaim_expired(
            cur,
            row,
            terminal=terminal,
            charged=charged,
            worker=worker,
            error=error,
            gone_for=gone_for,
            delay=delay,
        )
    if won:
        evidence = {
            "event": "reclaim" if gone_for is None else "rescue",
            "job_id": row.id,
            "kind": row.kind,
            "attempt": row.attempt,
            "worker": row.worker,
            "last_heartbeat": _iso(row.heartbeat_at),
            "lease_expires_at": _iso(row.lease_expires_at),
            "charged": charged,
            "terminal": terminal,
            "reaper": worker,
        }
        logger.warning(
            ("lease reclaimed" if gone_for is None else "worker exited, lease reclaimed")
            + ": job=%(job_id)s kind=%(kind)s attempt=%(attempt)s "
            "worker=%(worker)s last_heartbeat=%(last_heartbeat)s "
            "lease_expires_at=%(lease_expires_at)s charged=%(charged)s terminal=%(terminal)s",
            evidence,
            extra={"fields": evidence},
        )
    return won


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else value


def find_expired(limit: int) -> list[ExpiredRow]:
    with connection.cursor() as cur:
        return driver().find_expired(cur, limit)


def find_held_by(owner: str, gone_for: float, limit: int) -> list[ExpiredRow]:
    """The running jobs whose current attempt worker `owner` (seen dead `gone_for` seconds ago)
    claimed before then and never ended."""
    with connection.cursor() as cur:
        return driver().find_held_by(cur, owner, gone_for, limit)
