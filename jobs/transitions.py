"""The only writer of a job's state, attempt, lease and result.

Owns: claim, heartbeat, checkpoint, commit, fail, reclaim_expired -- each one conditional statement
decided inside the database against (id, attempt, state), with its Attempt and event rows in the
same transaction. Never: reads a job into Python and saves it back; retries or forces a write that
changed zero rows.

A write that changes zero rows is a lost lease. `_rejected` records it (job, attempt presented,
attempt current, worker, which write) in its own short transaction, logs one line with both
attempts and raises LeaseLost; the caller discards its work.
"""

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from jobs.exceptions import LeaseLost
from jobs.sql import ClaimedRow, CommitRow, Driver, FenceRow, driver_for
from jobs.states import AttemptOutcome, Write

logger = logging.getLogger("jobs.fencing")


@dataclass(frozen=True)
class Fence:
    """What a worker carries after a claim and presents on every write."""

    job_id: int
    attempt: int
    worker: str


@dataclass(frozen=True)
class Claimed:
    fence: Fence
    kind: str
    payload: Any
    max_attempts: int | None
    lease_seconds: float | None


def _driver() -> Driver:
    return driver_for(connection.vendor)


@contextmanager
def _fenced_write(*, outermost: bool) -> Iterator[None]:
    """The transaction a fenced write runs in.

    On PostgreSQL each hot-path transition is one statement, atomic on its own: running it in
    autocommit saves the BEGIN and COMMIT round trips (about 30% of drain throughput). SQLite's
    driver issues several statements, so it gets a real transaction. `outermost` writes (claim,
    commit, fail, reclaim) must never join a caller's transaction -- their decision would then
    only count once that caller commits -- exactly as `atomic(durable=True)` enforces.
    """
    if outermost and connection.in_atomic_block and not _inside_test_case():
        raise RuntimeError("a fenced transition must not run inside another transaction")
    if _driver().single_statement_writes and not connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        yield


def _inside_test_case() -> bool:
    # Django's TestCase wraps each test in atomic blocks it marks; durable=True exempts them too.
    return all(getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def claim(
    worker: str, *, limit: int = 1, lease_seconds: float, queues: Sequence[str] | None = None
) -> list[Claimed]:
    """Take up to `limit` due queued jobs: attempt + 1, lease from the database clock."""
    with _fenced_write(outermost=True), connection.cursor() as cur:
        rows: list[ClaimedRow] = _driver().claim(cur, worker, limit, lease_seconds, queues)
    return [
        Claimed(Fence(r.id, r.attempt, worker), r.kind, r.payload, r.max_attempts, r.lease_seconds)
        for r in rows
    ]


def heartbeat_many(fences: Sequence[tuple[Fence, float]]) -> set[int]:
    """Extend the leases still owned in one statement; return the job ids whose lease is gone.

    The caller records each loss it acts on with record_lost_heartbeat(): the background
    heartbeat ignores a loss for a job its runner has meanwhile released to commit.
    """
    if not fences:
        return set()
    rows = [FenceRow(f.job_id, f.attempt, lease) for f, lease in fences]
    with _fenced_write(outermost=False), connection.cursor() as cur:
        held = _driver().heartbeat(cur, rows)
    return {f.job_id for f, _ in fences if f.job_id not in held}


def record_lost_heartbeat(fence: Fence) -> None:
    _record(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def heartbeat(fence: Fence, lease_seconds: float) -> None:
    """Extend one lease; raise LeaseLost (recorded) when it changed zero rows."""
    if heartbeat_many([(fence, lease_seconds)]):
        _rejected(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def checkpoint(fence: Fence, progress: Any, lease_seconds: float) -> None:
    """Store progress and extend the lease in one fenced write."""
    with _fenced_write(outermost=False), connection.cursor() as cur:
        ok = _driver().checkpoint(cur, fence.job_id, fence.attempt, progress, lease_seconds)
    if not ok:
        _rejected(fence, Write.CHECKPOINT, AttemptOutcome.LOST)


def commit_many(items: Sequence[tuple[Fence, Any, str]]) -> list[Fence]:
    """End several attempts as succeeded in one statement, each fenced by its own attempt.

    Returns the fences whose commit changed zero rows, each already recorded. Never part of a
    caller's transaction.
    """
    if not items:
        return []
    worker = items[0][0].worker
    if any(f.worker != worker for f, _, _ in items):
        raise ValueError("one commit statement speaks for one worker")
    rows = [CommitRow(f.job_id, f.attempt, result, ref) for f, result, ref in items]
    with _fenced_write(outermost=True), connection.cursor() as cur:
        committed = _driver().commit(cur, worker, rows)
    rejected = [f for f, _, _ in items if f.job_id not in committed]
    for fence in rejected:
        _record(fence, Write.COMMIT, AttemptOutcome.REJECTED)
    return rejected


def commit(fence: Fence, result: Any, result_ref: str = "") -> None:
    """End one attempt as succeeded; raise LeaseLost (recorded) if its fence no longer holds."""
    if commit_many([(fence, result, result_ref)]):
        raise LeaseLost(fence.job_id, fence.attempt, Write.COMMIT)


def fail(fence: Fence, error: str, retry_in: float | None) -> None:
    """End the attempt as failed: queued again after `retry_in` seconds, or failed for good.

    Fenced like commit, so a stale failure can never overwrite a newer attempt's outcome.
    """
    with _fenced_write(outermost=True), connection.cursor() as cur:
        ok = _driver().fail(cur, fence.job_id, fence.attempt, fence.worker, error, retry_in)
    if not ok:
        _rejected(fence, Write.FAIL, AttemptOutcome.REJECTED)


def reclaim_expired(job_id: int, attempt: int, *, terminal: bool, worker: str) -> bool:
    """The reaper's compare-and-set; False (recorded) when a commit or heartbeat got there first."""
    with transaction.atomic(durable=True), connection.cursor() as cur:
        ok = _driver().reclaim_expired(cur, job_id, attempt, terminal, worker)
    if not ok:
        _record(Fence(job_id, attempt, worker), Write.RECLAIM, None)
    return ok


def mark_lost(fence: Fence) -> None:
    """Close the attempt row of work discarded after its lease was lost (already recorded)."""
    with transaction.atomic(), connection.cursor() as cur:
        _driver().end_attempt(cur, fence.job_id, fence.attempt, AttemptOutcome.LOST)


def read_outcome(job_id: int) -> tuple[str, int, str] | None:
    """(state, attempt, result_ref) as the database has it now; used after an unknown commit."""
    with connection.cursor() as cur:
        return _driver().read_job(cur, job_id)


def count_due(limit: int, queues: Sequence[str] | None = None) -> int:
    with connection.cursor() as cur:
        return _driver().count_due(cur, limit, queues)


def find_expired(limit: int) -> list[tuple[int, int, str, int | None]]:
    with connection.cursor() as cur:
        return _driver().find_expired(cur, limit)


def _record(fence: Fence, write: str, outcome: str | None) -> tuple[int, str] | None:
    with transaction.atomic(), connection.cursor() as cur:
        d = _driver()
        current = d.record_rejection(cur, fence.job_id, fence.attempt, fence.worker, write)
        if outcome is not None:
            d.end_attempt(cur, fence.job_id, fence.attempt, outcome)
    attempt_current, state_current = current if current else (None, "deleted")
    logger.warning(
        "stale %s rejected: job=%s attempt_presented=%s attempt_current=%s state_current=%s "
        "worker=%s",
        write,
        fence.job_id,
        fence.attempt,
        attempt_current,
        state_current,
        fence.worker,
    )
    return current


def _rejected(fence: Fence, write: str, outcome: str) -> None:
    _record(fence, write, outcome)
    raise LeaseLost(fence.job_id, fence.attempt, write)
