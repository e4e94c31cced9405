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
from collections.abc import Sequence
from typing import Any, Protocol

from django.db.backends.utils import CursorWrapper

from jobs.core.states import JobState


class Driver(Protocol):
    """What these statements need of a vendor driver (jobs/core/sql/base.py's Driver, which
    imports this module for its due count)."""

    now: str
    lock_row: str
    listen_notify: bool


RUNNING = JobState.RUNNING.value

# An enqueue notifies ENQUEUED_CHANNEL (payload: the queue) for the clusters serving every queue,
# and its queue's own channel for the clusters serving named queues -- while a process waits
# (WAITER below).
ENQUEUED_CHANNEL = "jobs_enqueued"
QUEUE_CHANNEL_PREFIX = "jobs_q_"


# Who waits for a wake-up, in advisory locks (the two-int form: class, key). A process about to
# block on LISTEN holds WAITER shared for as long as it waits; an enqueue's trigger sends its
# NOTIFY only while some process holds it -- the NOTIFY is what serializes committing enqueues
# (PostgreSQL takes one database-wide lock from a notifying commit's start to its end), so none is
# sent into a cluster whose workers are all busy and will claim the job anyway. FENCE closes the
# race: an enqueue takes it shared (until its commit) before it looks at WAITER, and a new waiter,
# once it holds WAITER, waits until it can take FENCE exclusively -- every enqueue that looked
# before it came is then committed or gone -- and claims once more before it blocks. Migration
# 0022 writes the same numbers into the triggers; a test keeps them in step.
WAKE_LOCK_CLASS = 0x5041_4C49  # "PALI"
WAITER_KEY = 1
FENCE_KEY = 2
# A waiter: hold WAITER, then try the fence (true: every enqueue that may have missed us is done).
WAIT_SQL = (
    f"SELECT pg_advisory_lock_shared({WAKE_LOCK_CLASS}, {WAITER_KEY}), "
    f"pg_try_advisory_lock({WAKE_LOCK_CLASS}, {FENCE_KEY}) "
    f"AND pg_advisory_unlock({WAKE_LOCK_CLASS}, {FENCE_KEY})"
)
FENCE_SQL = (
    f"SELECT pg_try_advisory_lock({WAKE_LOCK_CLASS}, {FENCE_KEY}) "
    f"AND pg_advisory_unlock({WAKE_LOCK_CLASS}, {FENCE_KEY})"
)
UNWAIT_SQL = f"SELECT pg_advisory_unlock_shared({WAKE_LOCK_CLASS}, {WAITER_KEY})"


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
    """(queue, paused, limit) of every queue paused or limited, by name (a resumed queue's row
    stays: counted into the LIMIT, 10,000 of them hid the paused queues named after them)."""
    cur.execute(
        "SELECT queue, paused, concurrency_limit FROM jobs_queuecontrol "
        "WHERE paused OR concurrency_limit IS NOT NULL ORDER BY queue LIMIT 10000"
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


# -- inside the claim ------------------------------------------------------------------------------


def _in_list(column: str, names: Sequence[str], params: dict[str, Any], prefix: str) -> str:
    """`column IN (...)` over bound parameters; never true for no names."""
    if not names:
        return "1 = 0"
    for i, name in enumerate(names):
        params[f"{prefix}{i}"] = name
    return f"{column} IN ({', '.join(f'%({prefix}{i})s' for i in range(len(names)))})"


def lock_limited(driver: Driver, cur: CursorWrapper, queues: Sequence[str] | None) -> list[str]:
    """Lock the control rows of the limited queues this claim may take from; return them.

    Runs in the claim's transaction, before the claim statement: the row lock makes claims of one
    limited queue take turns, and the claim statement that follows (a new snapshot under READ
    COMMITTED) then counts every running job committed by the claim before it -- so no two
    claims can both see room for the last slot. SKIP LOCKED: a queue another claim is taking
    from right now is left out of this claim rather than waited for (its rows stay blocked).
    """
    params: dict[str, Any] = {}
    served = f" AND {_in_list('queue', queues, params, 's')}" if queues else ""
    skip = f"{driver.lock_row} SKIP LOCKED" if driver.lock_row else ""
    cur.execute(
        "SELECT queue FROM jobs_queuecontrol WHERE concurrency_limit IS NOT NULL"
        f"{served} ORDER BY queue{skip}",
        params,
    )
    return [r[0] for r in cur.fetchall()]


def any_limited(cur: CursorWrapper, queues: Sequence[str] | None) -> bool:
    """Whether any queue this claim may take from has a limit (no lock)."""
    params: dict[str, Any] = {}
    served = f" AND {_in_list('queue', queues, params, 's')}" if queues else ""
    cur.execute(
        f"SELECT 1 FROM jobs_queuecontrol WHERE concurrency_limit IS NOT NULL{served} LIMIT 1",
        params,
    )
    return cur.fetchone() is not None


def claim_guard(locked: Sequence[str] | None, params: dict[str, Any]) -> str:
    """The claim's CTEs `room` and `blocked` (no leading WITH, a trailing comma).

    blocked: paused queues, limited queues whose control row this claim did not lock (another
    claim holds it, or the caller did not know of the limit: a new limit blocks, never
    overshoots), and locked queues already at their limit. room: how many more of each locked
    queue may start (the claim's `capped` step keeps each queue within it). `locked` None: count
    every limited queue's room without locks (the due count, which only estimates).
    """
    if locked is None:
        mine = mine_c = "1 = 1"
    else:
        mine = _in_list("queue", locked, params, "l")
        mine_c = _in_list("c.queue", locked, params, "l")
    return f"""room AS (
                SELECT c.queue, c.concurrency_limit - (
                           SELECT count(*) FROM jobs_job r
                            WHERE r.state = '{RUNNING}' AND r.queue = c.queue) AS room
                  FROM jobs_queuecontrol c WHERE c.concurrency_limit IS NOT NULL AND {mine_c}
            ), blocked AS (
                SELECT queue FROM jobs_queuecontrol
                 WHERE paused OR (concurrency_limit IS NOT NULL AND NOT ({mine}))
                UNION ALL SELECT queue FROM room WHERE room <= 0
            ),"""


BLOCKED = " AND queue NOT IN (SELECT queue FROM blocked)"

# Rows picked (in claim order), cut to each limited queue's room.
CAPPED = """capped AS (
                SELECT p.id FROM (
                    SELECT id, queue, row_number() OVER (
                               PARTITION BY queue ORDER BY priority DESC, run_at, id) AS n
                      FROM picked) p
                  LEFT JOIN room r ON r.queue = p.queue
                 WHERE r.room IS NULL OR p.n <= r.room
            )"""
