"""The only writer of a job's state, attempt, lease and result.

Owns: claim, heartbeat, checkpoint, commit, fail, release, reclaim_expired, poison -- each one
conditional statement decided inside the database against (id, attempt, state), with its Attempt
and event rows in the same transaction. Never: reads a job into Python and saves it back; retries
or forces a write that changed zero rows.

A write that changes zero rows is a lost lease. `_rejected` records it (job, attempt presented,
attempt current, worker, which write) in its own short transaction, logs one line with both
attempts and raises LeaseLost; the caller discards its work.
"""

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from jobs import bounds
from jobs.exceptions import LeaseLost
from jobs.registry import handler_leases
from jobs.sql import (
    ClaimedRow,
    CommitRow,
    Driver,
    ExpiredRow,
    FenceRow,
    IntentRow,
    driver_for,
    dumps,
    loads,
)
from jobs.states import AttemptOutcome, EventType, JobState, Write

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
    attempts_released: int = 0


def _driver() -> Driver:
    return driver_for(connection.vendor)


# Set by joining_callers_transaction() (SQLite only), per thread.
_joining = threading.local()


@contextmanager
def joining_callers_transaction() -> Iterator[None]:
    """SQLite only: fenced writes in this block run inside the caller's open transaction.

    SQLite has one writer. While a handler's transaction is open (IMMEDIATE) it holds the
    database's only write lock, so a fenced write on another connection would wait for the
    handler's COMMIT, which waits for that write: stuck until the busy timeout, then "database is
    locked". Joining is sound on SQLite alone: no other connection can change the job row until
    the caller's transaction ends, so the fenced statement decides against the row as it stands
    at the caller's COMMIT. A rejection is *not* recorded inside (the caller's rollback would
    erase it): it raises LeaseLost, and the caller records it with record_rejected() once its
    transaction is over.
    """
    if connection.vendor != "sqlite":
        raise RuntimeError("only SQLite's single writer makes joining a transaction sound")
    _joining.active = True
    try:
        yield
    finally:
        _joining.active = False


def _joined() -> bool:
    return bool(getattr(_joining, "active", False)) and connection.in_atomic_block


@contextmanager
def _fenced_write() -> Iterator[None]:
    """The transaction a fenced write runs in.

    On PostgreSQL each hot-path transition is one statement, atomic on its own: running it in
    autocommit saves the BEGIN and COMMIT round trips (about 30% of drain throughput). SQLite's
    driver issues several statements, so it gets a real transaction. A fenced write must never
    join a caller's transaction -- its decision would count only once that caller commits, and
    the job row's lock would last as long as the caller's work -- so inside an atomic block it
    runs as `atomic(durable=True)`, which refuses that (Django's TestCase blocks excepted).
    The one exception is SQLite inside joining_callers_transaction() (see there): a savepoint.
    """
    if _joined():
        with transaction.atomic():
            yield
    elif connection.in_atomic_block:
        with transaction.atomic(durable=True):
            yield
    elif _driver().single_statement_writes:
        yield
    else:
        with transaction.atomic():
            yield


def _row_refused(exc: DatabaseError) -> bool:
    """True when the database refused the statement's data, not when the connection failed."""
    return not isinstance(exc, OperationalError | InterfaceError)


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
            with _fenced_write(), connection.cursor() as cur:
                rows = _driver().claim(cur, worker, limit, lease_seconds, queues, leases)
        except DatabaseError as exc:
            if not _row_refused(exc):
                raise
            logger.warning("claim statement refused (%s); claiming one by one", exc)
            rows = _claim_one_by_one(worker, limit, lease_seconds, queues, leases)
        claimed = [c for c in (_decoded(r, worker) for r in rows) if c is not None]
        if claimed or not rows:
            return claimed
        # Every row taken was failed on the spot: the queue may hold more, look again.


def _claim_one_by_one(
    worker: str,
    limit: int,
    lease: float,
    queues: Sequence[str] | None,
    leases: dict[str, float],
) -> list[ClaimedRow]:
    with connection.cursor() as cur:
        ids = _driver().due_ids(cur, limit, queues)
    rows: list[ClaimedRow] = []
    for job_id in ids:
        try:
            with _fenced_write(), connection.cursor() as cur:
                rows += _driver().claim(cur, worker, 1, lease, queues, leases, only_id=job_id)
        except DatabaseError as exc:
            if not _row_refused(exc):
                raise
            try:
                poison(job_id, f"the database refused to claim this job: {exc}", worker)
            except DatabaseError as refused:
                if not _row_refused(refused):
                    raise
                # Refused even as a failure: it stays queued, and the rows after it move on.
                logger.error("job %s: refused to claim and to fail: %s", job_id, refused)
    return rows


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
    with _fenced_write(), connection.cursor() as cur:
        done = _driver().poison(cur, job_id, bounds.storable_error(error), worker)
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
    with _fenced_write(), connection.cursor() as cur:
        held = _driver().heartbeat(cur, rows, confirm.job_id if confirm else None)
    return {f.job_id for f, _ in fences if f.job_id not in held}


def record_lost_heartbeat(fence: Fence) -> None:
    _record(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def heartbeat(fence: Fence, lease_seconds: float) -> None:
    """Extend one lease; raise LeaseLost (recorded) when it changed zero rows."""
    if heartbeat_many([(fence, lease_seconds)]):
        _rejected(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def confirm_running(fence: Fence) -> None:
    """Mark, before its handler runs, that this attempt runs; LeaseLost if the fence is gone."""
    with _fenced_write(), connection.cursor() as cur:
        ok = _driver().confirm_running(cur, fence.job_id, fence.attempt)
    if not ok:
        _rejected(fence, Write.HEARTBEAT, AttemptOutcome.LOST)


def checkpoint(fence: Fence, progress: Any, lease_seconds: float) -> None:
    """Store progress and extend the lease in one fenced write."""
    with _fenced_write(), connection.cursor() as cur:
        ok = _driver().checkpoint(cur, fence.job_id, fence.attempt, progress, lease_seconds)
    if not ok:
        _rejected(fence, Write.CHECKPOINT, AttemptOutcome.LOST)


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
    if any(f.worker != worker for f, _, _ in items):
        raise ValueError("one commit statement speaks for one worker")
    by_job = intents or {}
    rows = [
        CommitRow(f.job_id, f.attempt, result, ref, tuple(by_job.get(f.job_id, ())))
        for f, result, ref in items
    ]
    with _fenced_write(), connection.cursor() as cur:
        committed = _driver().commit(cur, worker, rows)
    rejected = []
    for fence, _, _ in items:
        if fence.job_id in committed or _landed(fence, AttemptOutcome.SUCCEEDED):
            continue
        _record(fence, Write.COMMIT, AttemptOutcome.REJECTED)
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
    with _fenced_write(), connection.cursor() as cur:
        ok = _driver().fail(cur, fence.job_id, fence.attempt, fence.worker, error, retry_in)
    if not ok and not _landed(fence, AttemptOutcome.FAILED):
        _rejected(fence, Write.FAIL, AttemptOutcome.REJECTED)


def release(fence: Fence) -> None:
    """Hand a claimed job back before its handler started: queued now, the attempt uncharged."""
    with _fenced_write(), connection.cursor() as cur:
        ok = _driver().release(cur, fence.job_id, fence.attempt, fence.worker)
    if not ok and not _landed(fence, AttemptOutcome.RELEASED):
        _rejected(fence, Write.RELEASE, AttemptOutcome.REJECTED)


def reclaim_expired(
    row: ExpiredRow, *, terminal: bool, charged: bool, worker: str, error: str = ""
) -> bool:
    """The reaper's compare-and-set; False when a commit, beat or other reaper got there first.

    A lost race is not a stale write (the reaper holds no attempt), so it is not recorded as a
    rejection; the reaper counts it on its own.
    """
    with _fenced_write(), connection.cursor() as cur:
        won = _driver().reclaim_expired(
            cur, row, terminal=terminal, charged=charged, worker=worker, error=error
        )
    if won:
        evidence = {
            "event": "reclaim",
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
            "lease reclaimed: job=%(job_id)s kind=%(kind)s attempt=%(attempt)s "
            "worker=%(worker)s last_heartbeat=%(last_heartbeat)s "
            "lease_expires_at=%(lease_expires_at)s charged=%(charged)s terminal=%(terminal)s",
            evidence,
            extra={"fields": evidence},
        )
    return won


def _iso(value: Any) -> str | None:
    return value.isoformat() if hasattr(value, "isoformat") else value


def mark_lost(fence: Fence) -> None:
    """Close the attempt row of work discarded after its lease was lost (already recorded)."""
    with transaction.atomic(), connection.cursor() as cur:
        _driver().end_attempt(cur, fence.job_id, fence.attempt, AttemptOutcome.LOST)


def attempt_outcome(fence: Fence) -> str | None:
    """The outcome the database holds for this attempt (None: no such attempt row)."""
    with connection.cursor() as cur:
        return _driver().read_attempt_outcome(cur, fence.job_id, fence.attempt)


def _landed(fence: Fence, outcome: str) -> bool:
    # Only this attempt's own write sets its outcome to `outcome`; the job's state alone cannot
    # tell (a reaper's requeue and a retrying fail both leave it queued at the same attempt).
    return attempt_outcome(fence) == outcome


def count_due(limit: int, queues: Sequence[str] | None = None) -> int:
    with connection.cursor() as cur:
        return _driver().count_due(cur, limit, queues)


def find_expired(limit: int) -> list[ExpiredRow]:
    with connection.cursor() as cur:
        return _driver().find_expired(cur, limit)


def _record(fence: Fence, write: str, outcome: str | None) -> tuple[int, str] | None:
    from jobs.sql.operator import rejection_context

    with transaction.atomic(), connection.cursor() as cur:
        d = _driver()
        current = d.record_rejection(cur, fence.job_id, fence.attempt, fence.worker, write)
        kind, lateness = rejection_context(d, cur, fence.job_id, fence.attempt)
        if outcome is not None:
            d.end_attempt(cur, fence.job_id, fence.attempt, outcome)
    attempt_current, state_current = current if current else (None, "deleted")
    fields = {
        "event": "stale_write_rejected",
        "write": str(write),
        "job_id": fence.job_id,
        "kind": kind,
        "attempt_presented": fence.attempt,
        "attempt_current": attempt_current,
        "state_current": str(state_current),
        "worker": fence.worker,
        # Seconds since this attempt's last accepted heartbeat (database clock).
        "lateness_seconds": lateness,
    }
    logger.warning(
        "stale %(write)s rejected: job=%(job_id)s kind=%(kind)s "
        "attempt_presented=%(attempt_presented)s attempt_current=%(attempt_current)s "
        "state_current=%(state_current)s worker=%(worker)s lateness=%(lateness_seconds)ss",
        fields,
        extra={"fields": fields},
    )
    return current


def record_rejected(fence: Fence, write: str) -> None:
    """Record a rejection seen inside a caller's transaction, once that transaction is over."""
    _record(fence, write, AttemptOutcome.LOST)


def _rejected(fence: Fence, write: str, outcome: str) -> None:
    if not _joined():  # joined: the caller records it after its transaction (see above)
        _record(fence, write, outcome)
    raise LeaseLost(fence.job_id, fence.attempt, write)


# -- operator transitions: requeue, cancel, retry now (admin actions and `manage.py jobs`) ------
#
# An operator's write is fenced like a worker's: the row is locked (select_for_update) and read,
# the decision is made on what was read, and the filtered UPDATE carries the fence (id, attempt,
# state as read), so a claim, commit or reclaim that slipped in makes it change zero rows: the
# job is then skipped ("changed meanwhile"), never overwritten. Taking a running job away ends
# its attempt (`requeued`/`cancelled`); that worker's next heartbeat or commit changes zero rows
# and is recorded like any zombie's. An operator's requeue gives the job a fresh budget of
# attempts (every earlier claim counts as released), so a job that exhausted max_attempts runs
# again.


@dataclass(frozen=True)
class OperatorResult:
    """What one operator transition did to one job (`changed`), or why it skipped it."""

    job_id: int
    action: str
    changed: bool
    reason: str
    state_before: str = ""
    attempt: int = 0  # the attempt the fence carried (the worker's, for a running job)
    new_job_id: int | None = None  # enqueue a copy: the copy


def _operator_write(
    job_id: int,
    action: str,
    actor: str,
    plan: Callable[[str, int], tuple[dict[str, Any], str, str | None] | str],
) -> OperatorResult:
    from django.db import IntegrityError

    from jobs.models import Job
    from jobs.sql.operator import close_running_attempt, database_now

    driver = _driver()
    try:
        with transaction.atomic():
            row = (
                Job.objects.select_for_update()
                .filter(pk=job_id)
                .values_list("state", "attempt")
                .first()
            )
            if row is None:
                return OperatorResult(job_id, action, False, "no such job")
            state, attempt = row
            decided = plan(state, attempt)
            if isinstance(decided, str):
                return OperatorResult(job_id, action, False, decided, state, attempt)
            fields, event, outcome = decided
            now = database_now(driver)
            extra = fields.pop("_filter", {})
            changed = Job.objects.filter(pk=job_id, attempt=attempt, state=state, **extra).update(
                **{k: (now if v is _NOW else v) for k, v in fields.items()}, updated_at=now
            )
            if changed != 1:
                reason = "already due" if extra else "changed meanwhile"
                return OperatorResult(job_id, action, False, reason, state, attempt)
            data = dumps({"by": actor[:200], "action": action, "from": state})
            with connection.cursor() as cur:
                if outcome is not None:
                    note = f"{action} by {actor[:200]}"
                    close_running_attempt(driver, cur, job_id, attempt, outcome, note)
                driver.insert_event(cur, job_id, attempt, event, actor[:200], data)
    except IntegrityError as exc:
        if "unique_key" not in str(exc):
            raise
        reason = "another live job holds its unique_key"
        return OperatorResult(job_id, action, False, reason, state, attempt)
    fields_logged = {
        "event": f"operator_{action}",
        "action": action,
        "job_id": job_id,
        "attempt": attempt,
        "state_before": state,
        "by": actor,
    }
    logger.warning(
        "operator %(action)s: job=%(job_id)s attempt=%(attempt)s state_before=%(state_before)s "
        "by=%(by)s",
        fields_logged,
        extra={"fields": fields_logged},
    )
    return OperatorResult(
        job_id, action, True, f"{state} -> {fields.get('state', state)}", state, attempt
    )


_NOW = object()  # placeholder for the database clock in an operator plan


def _back_to_queue(state: str) -> dict[str, Any]:
    from django.db.models import F

    return {
        "state": JobState.QUEUED,
        "run_at": _NOW,
        "lease_expires_at": None,
        "finished_at": None,
        "attempts_released": F("attempt"),  # a fresh budget: earlier claims no longer count
    }


def requeue(job_id: int, actor: str) -> OperatorResult:
    """Queue the job again now: running (taken from its worker, fenced), failed or cancelled."""

    def plan(state: str, attempt: int) -> tuple[dict[str, Any], str, str | None] | str:
        if state == JobState.RUNNING:
            return _back_to_queue(state), EventType.REQUEUED, AttemptOutcome.REQUEUED
        if state in (JobState.FAILED, JobState.CANCELLED):
            return _back_to_queue(state), EventType.REQUEUED, None
        if state == JobState.QUEUED:
            return "already queued"
        return f"{state}: enqueue a copy to run it again"

    return _operator_write(job_id, "requeue", actor, plan)


def cancel(job_id: int, actor: str) -> OperatorResult:
    """End a queued or running job as cancelled; a running worker learns at its next beat."""

    def plan(state: str, attempt: int) -> tuple[dict[str, Any], str, str | None] | str:
        fields: dict[str, Any] = {
            "state": JobState.CANCELLED,
            "finished_at": _NOW,
            "lease_expires_at": None,
        }
        if state == JobState.RUNNING:
            return fields, EventType.CANCELLED, AttemptOutcome.CANCELLED
        if state == JobState.QUEUED:
            return fields, EventType.CANCELLED, None
        return f"already {state}"

    return _operator_write(job_id, "cancel", actor, plan)


def retry_now(job_id: int, actor: str) -> OperatorResult:
    """A failed job runs again now (fresh budget); a queued one waiting for its backoff runs now."""
    from jobs.sql.operator import database_now

    def plan(state: str, attempt: int) -> tuple[dict[str, Any], str, str | None] | str:
        if state == JobState.FAILED:
            return _back_to_queue(state), EventType.REQUEUED, None
        if state == JobState.QUEUED:
            # Decided in the UPDATE: only a row whose run_at is still ahead moves.
            return (
                {"run_at": _NOW, "_filter": {"run_at__gt": database_now(_driver())}},
                EventType.REQUEUED,
                None,
            )
        return f"{state}: only failed or waiting jobs are retried"

    return _operator_write(job_id, "retry", actor, plan)
