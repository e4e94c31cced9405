"""A worker's transitions of the job row: claim, heartbeat, checkpoint, commit, fail, release.

Owns: each one conditional statement decided inside the database against (id, attempt, state),
with its Attempt and event rows in the same transaction (jobs/core/sql holds the SQL text).
Never: reads a job into Python and saves it back; retries or forces a write that changed zero
rows -- a zero-row write is a lost lease: recorded (fence.record), then LeaseLost.
"""

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import DatabaseError, connection, transaction

from jobs.core import bounds
from jobs.core.exceptions import LeaseLost
from jobs.core.registry import handler_leases
from jobs.core.sql import ClaimedRow, CommitRow, FenceRow, IntentRow, loads
from jobs.core.sql import queues as sql_queues
from jobs.core.sql.rows import loads_many
from jobs.core.states import AttemptOutcome, Write
from jobs.core.transitions.fence import (
    Claimed,
    Fence,
    driver,
    fenced_statement,
    hot_cursor,
    landed,
    record,
    rejected,
    row_refused,
)

logger = logging.getLogger("jobs.fencing")


def claim(
    worker: str, *, limit: int = 1, lease_seconds: float, queues: Sequence[str] | None = None
) -> list[Claimed]:
    """Take up to `limit` due queued jobs: attempt + 1, lease from the database clock.

    The lease is the job's own, else its handler's, else `lease_seconds`. If the database refuses
    the statement because of some row's values, the due rows are claimed one by one and a row
    refused on its own is failed with the reason (poison): one bad row never stops the queue.
    """
    leases = handler_leases()
    while True:
        try:
            rows = _claim(worker, limit, lease_seconds, queues, leases)
        except DatabaseError as exc:
            if not row_refused(exc):
                raise
            logger.warning("claim statement refused (%s); claiming one by one", exc)
            rows = _claim_one_by_one(worker, limit, lease_seconds, queues, leases)
        claimed = _decoded_all(rows, worker)
        if claimed or not rows:
            return claimed
        # Every row taken was failed on the spot: the queue may hold more, look again.


# Whether this process's claims take from a limited queue, re-read at most every LIMITS_TTL s.
# Only a claim that knows of a limit locks its control row (one more statement, in a
# transaction); a claim that does not know of it yet leaves that queue alone (claim_guard), so a
# stale answer here delays a newly limited queue by LIMITS_TTL at most and never overshoots it.
LIMITS_TTL = 1.0
_limited: dict[tuple[str, ...] | None, tuple[float, bool]] = {}


def _claim(
    worker: str,
    limit: int,
    lease: float,
    queues: Sequence[str] | None,
    leases: dict[str, float],
    only_id: int | None = None,
) -> list[ClaimedRow]:
    d = driver()
    if not _takes_from_limited(queues):
        with fenced_statement(), hot_cursor() as cur:
            return d.claim(cur, worker, limit, lease, queues, leases, only_id=only_id)
    # The limited queues' control rows are locked first, in the claim's own transaction: the
    # claim statement then counts running jobs in a snapshot taken after the lock was granted.
    with _transaction(), hot_cursor() as cur:
        locked = sql_queues.lock_limited(d, cur, queues)
        return d.claim(cur, worker, limit, lease, queues, leases, only_id=only_id, locked=locked)


def _transaction() -> Any:
    if driver().single_statement_writes and not connection.in_atomic_block:
        return transaction.atomic()
    return fenced_statement()  # a transaction already (SQLite), or durable inside one


def refresh_limits(queues: Sequence[str] | None) -> None:
    """Re-read whether `queues` take from a limited queue if the answer is half its TTL old.

    An idle drain calls this while it waits (jobs.worker.runner), so that the claim a NOTIFY
    wakes it for finds a fresh answer and is one round trip, not two.
    """
    seen = _limited.get(tuple(queues) if queues else None)
    if seen is None or time.monotonic() - seen[0] > LIMITS_TTL / 2:
        _limited.pop(tuple(queues) if queues else None, None)
        _takes_from_limited(queues)


def _takes_from_limited(queues: Sequence[str] | None) -> bool:
    key = tuple(queues) if queues else None
    now = time.monotonic()
    seen = _limited.get(key)
    if seen is None or now - seen[0] > LIMITS_TTL:
        with connection.cursor() as cur:
            seen = (now, sql_queues.any_limited(cur, queues))
        _limited[key] = seen
    return seen[1]


def _claim_one_by_one(
    worker: str,
    limit: int,
    lease: float,
    queues: Sequence[str] | None,
    leases: dict[str, float],
) -> list[ClaimedRow]:
    with connection.cursor() as cur:
        ids = driver().due_ids(cur, limit, queues)
    rows: list[ClaimedRow] = []
    for job_id in ids:
        try:
            rows += _claim(worker, 1, lease, queues, leases, only_id=job_id)
        except DatabaseError as exc:
            if not row_refused(exc):
                raise
            try:
                poison(job_id, f"the database refused to claim this job: {exc}", worker)
            except DatabaseError as refused:
                if not row_refused(refused):
                    raise
                # Refused even as a failure: it stays queued, and the rows after it move on.
                logger.error("job %s: refused to claim and to fail: %s", job_id, refused)
    return rows


# Claimed and CommitRow are named tuples: made by tuple.__new__ from a tuple of all their fields
# they skip the generated __new__ (a Python frame) -- one per job claimed, one per job committed.
_new_tuple = tuple.__new__


def _decoded_all(rows: Sequence[ClaimedRow], worker: str) -> list[Claimed]:
    """The claimed jobs, each with its fence and its payload decoded, in claim order: the
    payloads in one json.loads, no object between a row and its Claimed (~11k instructions a job
    fewer than decoding row by row, and ~12k more for a small non-empty payload)."""
    try:
        payloads = loads_many([r[3] for r in rows])
        return [
            _new_tuple(Claimed, (Fence(i, a, worker), kind, payload, most, lease, released))
            for (i, a, kind, _, most, lease, released), payload in zip(rows, payloads, strict=True)
        ]
    except (ValueError, RecursionError):
        # Some payload will not decode: one by one, so each such job fails on its own.
        return [c for c in (_decoded(r, worker) for r in rows) if c is not None]


def _decoded(row: ClaimedRow, worker: str) -> Claimed | None:
    fence = Fence(row.id, row.attempt, worker)
    try:
        payload = loads(row.payload)
    except (ValueError, RecursionError) as exc:
        # Stored by something other than enqueue (which bounds depth): it will never decode.
        logger.warning("job %s: payload cannot be decoded (%s); failing it", row.id, exc)
        fail(fence, f"payload could not be decoded: {type(exc).__name__}: {exc}"[:500], None)
        return None
    return Claimed(
        fence, row.kind, payload, row.max_attempts, row.lease_seconds, row.attempts_released
    )


def poison(job_id: int, error: str, worker: str) -> bool:
    """Fail a queued row the database refuses to claim; True if it was still queued."""
    with fenced_statement(), hot_cursor() as cur:
        done = driver().poison(cur, job_id, bounds.storable_error(error), worker)
    logger.error("job %s failed unclaimed: %s", job_id, error)
    return done


def heartbeat_many(fences: Sequence[tuple[Fence, float]], confirm: Fence | None = None) -> set[int]:
    """Extend the leases still owned in one statement; return the job ids whose lease is gone.

    `confirm` names the job whose handler is running now: its attempt is marked as confirmed
    running (the reaper charges an expired attempt only when it was). The caller records each
    loss it acts on with record_lost_heartbeat(): the background heartbeat ignores a loss for a
    job its runner has meanwhile released to commit.
    """
    if not fences:
        return set()
    rows = [FenceRow(f.job_id, f.attempt, lease) for f, lease in fences]
    with fenced_statement(), hot_cursor() as cur:
        held = driver().heartbeat(cur, rows, confirm.job_id if confirm else None)
    return {f.job_id for f, _ in fences if f.job_id not in held}


def record_lost_heartbeat(fence: Fence) -> None:
    record(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def heartbeat(fence: Fence, lease_seconds: float) -> None:
    """Extend one lease; raise LeaseLost (recorded) when it changed zero rows."""
    if heartbeat_many([(fence, lease_seconds)]):
        rejected(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def confirm_running(fence: Fence) -> None:
    """Mark, before its handler runs, that this attempt runs; LeaseLost if the fence is gone."""
    with fenced_statement(), hot_cursor() as cur:
        ok = driver().confirm_running(cur, fence.job_id, fence.attempt)
    if not ok:
        rejected(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def checkpoint(fence: Fence, progress: Any, lease_seconds: float) -> None:
    """Store progress and extend the lease in one fenced write."""
    with fenced_statement(), hot_cursor() as cur:
        ok = driver().checkpoint(cur, fence.job_id, fence.attempt, progress, lease_seconds)
    if not ok:
        rejected(fence, Write.CHECKPOINT, AttemptOutcome.LOST)


def commit_many(
    items: Sequence[tuple[Fence, Any, str]],
    intents: Mapping[int, Sequence[IntentRow]] | None = None,
) -> list[Fence]:
    """End several attempts as succeeded in one statement, each fenced by its own attempt.

    `result_ref` (the third item) points the job at the attempt's staged outputs and `intents`
    (by job id) become outbox rows, both in the same statement: that is the promotion.

    Returns the fences whose commit changed zero rows, each already recorded -- except an
    attempt whose own earlier presentation already landed (a re-presented commit after an
    unknown outcome), which is simply done. Never part of a caller's transaction.
    """
    if not items:
        return []
    worker = items[0][0].worker
    by_job = intents or {}
    rows = []
    for f, result, ref in items:
        if f.worker != worker:
            raise ValueError("one commit statement speaks for one worker")
        job_intents = by_job.get(f.job_id)
        rows.append(
            _new_tuple(
                CommitRow,
                (f.job_id, f.attempt, result, ref, tuple(job_intents) if job_intents else ()),
            )
        )
    with fenced_statement(), hot_cursor() as cur:
        committed = driver().commit(cur, worker, rows)
    rejected = []
    for fence, _, _ in items:
        if fence.job_id in committed or landed(fence, AttemptOutcome.SUCCEEDED):
            continue
        record(fence, Write.COMMIT, AttemptOutcome.REJECTED)
        rejected.append(fence)
    return rejected


def commit(fence: Fence, result: Any, result_ref: str = "") -> None:
    """End one attempt as succeeded; raise LeaseLost (recorded) if its fence no longer holds."""
    if commit_many([(fence, result, result_ref)]):
        raise LeaseLost(fence.job_id, fence.attempt, Write.COMMIT)


def fail(fence: Fence, error: str, retry_in: float | None) -> None:
    """End the attempt as failed: queued again after `retry_in` seconds, or failed for good.

    Fenced like commit, so a stale failure can never overwrite a newer attempt's outcome.
    """
    error = bounds.storable_error(error)
    with fenced_statement(), hot_cursor() as cur:
        ok = driver().fail(cur, fence.job_id, fence.attempt, fence.worker, error, retry_in)
    if not ok and not landed(fence, AttemptOutcome.FAILED):
        rejected(fence, Write.FAIL, AttemptOutcome.REJECTED)


def release(fence: Fence) -> None:
    """Hand a claimed job back before its handler started: queued again in its place (priority
    and original due time kept), the attempt uncharged; job, attempt and event change together."""
    with fenced_statement(), hot_cursor() as cur:
        ok = driver().release(cur, fence.job_id, fence.attempt, fence.worker)
    if not ok and not landed(fence, AttemptOutcome.RELEASED):
        rejected(fence, Write.RELEASE, AttemptOutcome.REJECTED)


def mark_lost(fence: Fence) -> None:
    """Close the attempt row of work discarded after its lease was lost (already recorded)."""
    with transaction.atomic(), connection.cursor() as cur:
        driver().end_attempt(cur, fence.job_id, fence.attempt, AttemptOutcome.LOST)


def count_due(limit: int, queues: Sequence[str] | None = None) -> int:
    """The scheduler's due count -- not a pure read: it first promotes rows deferred far ahead,
    as a claim does (jobs/core/sql/base.py says why: with no drain standing, nothing else would),
    so it fails on a read-only session. Screens and /metrics read `Job.objects.due()` instead."""
    with connection.cursor() as cur:
        return driver().count_due(cur, limit, queues)
