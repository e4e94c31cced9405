"""Statements of the queue controls (pause, resume, limit) and of the per-queue wake-up channels.

Owns: the SQL text that writes jobs_queuecontrol, the wake-up a resume sends, the read of the
running jobs per queue, and `queue_channel()`, the NOTIFY channel of one queue -- the enqueue
trigger (migration 0010) computes the same name in SQL. Never: decides (jobs/ops/queues.py does),
and never touches a job row.

Hazards: LISTEN takes an identifier of at most 63 bytes and queue names are up to 64 characters,
so a queue's channel is named by the md5 of its name (fixed length, any characters); a test keeps
this function and the trigger's SQL in step. NOTIFY is sent at COMMIT, so a resume wakes the
workers only once the row saying so is visible to their claim.
"""

import hashlib

from django.db.backends.utils import CursorWrapper

from jobs.core.sql.base import RUNNING, Driver

# Every enqueue notifies ENQUEUED_CHANNEL (payload: the queue) for the clusters serving every
# queue, and its queue's own channel for the clusters serving named queues.
ENQUEUED_CHANNEL = "jobs_enqueued"
QUEUE_CHANNEL_PREFIX = "jobs_q_"


def queue_channel(queue: str) -> str:
    """The NOTIFY channel of one queue: `jobs_q_` + md5 of its name (39 characters)."""
    return QUEUE_CHANNEL_PREFIX + hashlib.md5(queue.encode(), usedforsecurity=False).hexdigest()


def ensure_row(driver: Driver, cur: CursorWrapper, queue: str) -> None:
    cur.execute(
        "INSERT INTO jobs_queuecontrol (queue, paused, concurrency_limit, changed_at, changed_by) "
        f"VALUES (%(q)s, false, NULL, {driver.now}, '') ON CONFLICT (queue) DO NOTHING",
        {"q": queue},
    )


def set_paused(driver: Driver, cur: CursorWrapper, queue: str, paused: bool, by: str) -> bool:
    """Pause or resume; True if the row changed (False: it already was so)."""
    ensure_row(driver, cur, queue)
    cur.execute(
        f"UPDATE jobs_queuecontrol SET paused = %(p)s, changed_at = {driver.now}, "
        "changed_by = %(by)s WHERE queue = %(q)s AND paused <> %(p)s",
        {"q": queue, "p": paused, "by": by},
    )
    return cur.rowcount == 1


def set_limit(
    driver: Driver, cur: CursorWrapper, queue: str, limit: int | None, by: str
) -> int | None:
    """Set (or with None remove) the queue's concurrency limit; return the previous one."""
    ensure_row(driver, cur, queue)
    cur.execute(
        f"SELECT concurrency_limit FROM jobs_queuecontrol WHERE queue = %(q)s{driver.lock_row}",
        {"q": queue},
    )
    previous = cur.fetchone()[0]
    cur.execute(
        f"UPDATE jobs_queuecontrol SET concurrency_limit = %(n)s, changed_at = {driver.now}, "
        "changed_by = %(by)s WHERE queue = %(q)s",
        {"q": queue, "n": limit, "by": by},
    )
    return None if previous is None else int(previous)


def controls(cur: CursorWrapper) -> list[tuple[str, bool, int | None]]:
    """(queue, paused, limit) of every queue with a control row, by name."""
    cur.execute(
        "SELECT queue, paused, concurrency_limit FROM jobs_queuecontrol ORDER BY queue LIMIT 10000"
    )
    return [(q, bool(p), None if n is None else int(n)) for q, p, n in cur.fetchall()]


def running_per_queue(cur: CursorWrapper) -> dict[str, int]:
    """Running jobs per queue (walks jobs_job_running_queue_idx: running rows only)."""
    cur.execute(
        f"SELECT queue, count(*) FROM jobs_job WHERE state = '{RUNNING}' GROUP BY queue "
        "ORDER BY count(*) DESC LIMIT 10000"
    )
    return {q: int(n) for q, n in cur.fetchall()}


def wake(driver: Driver, cur: CursorWrapper, queue: str) -> None:
    """Wake every worker serving `queue` (sent at COMMIT); nothing to do on SQLite (it polls)."""
    if driver.listen_notify:
        cur.execute(
            "SELECT pg_notify(%(all)s, %(q)s), pg_notify(%(one)s, '')",
            {"all": ENQUEUED_CHANNEL, "q": queue, "one": queue_channel(queue)},
        )
