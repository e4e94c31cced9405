"""The lease reaper: reclaims running jobs whose lease ran out.

Owns: deciding, per expired job, between "queued again" and "failed" (its last charged attempt
expired), and whether the expired attempt counts. Never: writes without the compare-and-set in
transitions.reclaim_expired, which re-checks state, attempt and expiry inside the database -- so a
commit or heartbeat that lands between our read and our write wins, and two reapers running at
once are harmless.

Charging: an attempt counts against max_attempts only if a heartbeat (or, for a job with released
attempts, an explicit write before its handler ran) confirmed its handler running. An attempt that
expired unconfirmed -- claimed in a batch whose worker died before reaching it, or killed within its
first heartbeat interval -- is requeued uncharged. Its job is confirmed explicitly from then on, so
a job that kills its worker is charged at its next run and ends with its own error; a "never
started" verdict costs nothing per job (the confirmation rides on the heartbeat).

Rescue: a worker process qcluster's main process saw die (jobs.worker.rescue) has its open
attempts reclaimed at once, decided and charged the same way; the statement requires the attempt
to be that process's, still open, and claimed before it was seen dead, instead of an expired lease.

Hazards: one row the database refuses must not stop the others: each reclaim is its own statement
and a refused one is logged and skipped. A lost race is not a stale write (the reaper holds no
attempt): it is counted in `lost_races`, never recorded as a RejectedWrite.
"""

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from jobs.core import policy, registry, transitions
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import UnknownKind
from jobs.core.registry import Handler, get_handler
from jobs.core.sql import ExpiredRow

logger = logging.getLogger("jobs.reaper")


@dataclass
class ReaperStats:
    """Counts for this process (metrics read them)."""

    reclaimed: int = 0
    uncharged: int = 0
    lost_races: int = 0
    refused: int = 0


stats = ReaperStats()


def _handler(kind: str) -> Handler | None:
    try:
        return get_handler(kind)
    except UnknownKind:
        return None
    except Exception:  # noqa: BLE001  a lookup that raises (a resolver's import): its defaults
        logger.warning("looking up the handler of kind %r raised", kind, exc_info=True)
        return None


# tell(kind, job_id, attempt): a reclaim that failed its job landed; the kind's on_finished
# hook hears of it.
Tell = Callable[[str, int, int], None]


def tell_now(kind: str, job_id: int, attempt: int) -> None:
    """On the reclaiming thread: a hook's exception is logged; the reclaim has landed."""
    try:  # the failure landed: the kind's hook hears of it (jobs.tasks: task_finished)
        registry.finished(kind, job_id, attempt, False)
    except Exception:  # noqa: BLE001  the reclaim has landed; a hook cannot change it
        logger.exception("job %s: the on_finished hook failed", job_id)


HOOK_THREADS = 4  # threads telling on_finished hooks at once; more hooks wait their turn

# The jobs a reclaim failed whose kind's hook is still to hear of it, and how many threads tell.
_told: deque[tuple[str, int, int]] = deque()
_tellers = [0]
_tell_lock = threading.Lock()


def tell_later(kind: str, job_id: int, attempt: int) -> None:
    """A reclaim failed the job (its last attempt): its kind's on_finished hook -- user code --
    hears of it on a thread of its own, never the reclaiming one (the watchdog's rescues, the
    scheduler's reaping): a hook that blocks or raises (SystemExit too) would hold up, or end,
    the looks, kills and rescues of every worker, or every tick of the scheduler. At
    most HOOK_THREADS hooks run at once; beyond that they wait (one hook that never returns
    delays no other job's while a thread is free)."""
    with _tell_lock:
        _told.append((kind, job_id, attempt))
        if _tellers[0] >= HOOK_THREADS:
            logger.warning(
                "job %s: its on_finished hook waits: %s hooks of reclaimed jobs are still running",
                job_id,
                HOOK_THREADS,
            )
            return
        _tellers[0] += 1
    try:
        threading.Thread(target=_tell, name="jobs-reclaim-finished", daemon=True).start()
    except Exception:  # noqa: BLE001  no thread to be had (RuntimeError at a limit or as the
        # interpreter ends, MemoryError): the slot is given back -- else four such failures and
        # no hook would ever be told -- and the job's hook waits for the next one to start.
        with _tell_lock:
            _tellers[0] -= 1
        logger.exception("job %s: no thread to tell its on_finished hook yet", job_id)


def _tell() -> None:
    try:
        while True:
            with _tell_lock:
                if not _told:
                    _tellers[0] -= 1
                    return
                kind, job_id, attempt = _told.popleft()
            try:
                registry.finished(kind, job_id, attempt, False)
            except BaseException:  # noqa: BLE001  SystemExit too: the failure has landed
                logger.exception("job %s attempt %s: the on_finished hook failed", job_id, attempt)
            # The next hook told on this thread must not inherit this one's connection broken
            # (a database restart: "the connection is closed" for a fault not its own) or left
            # outside autocommit: Django's between-requests check, a round trip only after an
            # error.
            try:
                connection.close_if_unusable_or_obsolete()
            except DatabaseError:
                connection.close()
    finally:
        connection.close()  # a hook's queries used this thread's own connection


def reap(worker: str, limit: int = 200, tell: Tell = tell_now) -> int:
    """Reclaim up to `limit` expired leases; return how many this call reclaimed. The scheduler
    passes `tell_later` (its ticks must not wait for, or end with, a hook); a one-off caller
    (`manage.py`) keeps `tell_now`, so the hook has run when it returns."""
    return _reclaim_all(transitions.find_expired(limit), worker, None, tell)


def rescue(
    owner: str, seen_dead_at: float, worker: str, limit: int = 200, tell: Tell = tell_now
) -> int:
    """Reclaim at once the jobs whose open attempts worker process `owner` ("<host>:<pid>",
    seen dead at time.monotonic() `seen_dead_at`) claimed before then (jobs.worker.rescue):
    decided and charged like an expiry, without waiting out the lease. A job failed by it is
    told through `tell` (jobs.worker.rescue's runs the hook off the watchdog's thread)."""
    rows = transitions.find_held_by(owner, time.monotonic() - seen_dead_at, limit)
    return _reclaim_all(rows, worker, seen_dead_at, tell)


def _reclaim_all(
    rows: list[ExpiredRow], worker: str, seen_dead_at: float | None, tell: Tell
) -> int:
    reclaimed = 0
    for row in rows:
        try:
            reclaimed += _reclaim(row, worker, seen_dead_at, tell)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError:
            stats.refused += 1
            logger.exception("job %s attempt %s: reclaim refused; skipped", row.id, row.attempt)
    return reclaimed


def _reclaim(
    row: ExpiredRow, worker: str, seen_dead_at: float | None = None, tell: Tell = tell_now
) -> int:
    cfg = jobs_settings()
    limit = policy.max_attempts_for(row.max_attempts, _handler(row.kind), cfg)
    charged = policy.charged_attempts(row.attempt, row.attempts_released)
    if seen_dead_at is None:  # an expired lease is already late: due at once
        decision = policy.decide_expiry(charged, limit)
    else:  # a worker's death is its job's failure as far as retries go: the failure's backoff
        decision = policy.decide_failure(charged, limit, cfg, jitter=random.random())
    terminal = row.confirmed and not decision.retry
    why = (
        "its lease expired: the worker stopped heartbeating (killed, stalled or cut off)"
        if seen_dead_at is None
        else "its worker process exited without ending it (killed: SIGKILL, out of memory)"
    )
    error = f"attempt {row.attempt} (charged attempt {charged} of {limit}) ran on {row.worker} "
    error += f"and {why}"
    # A rescue's fence: the attempt was claimed before its process was seen dead (as long ago
    # as now, measured when the statement is built, not when the rows were read).
    gone_for = None if seen_dead_at is None else time.monotonic() - seen_dead_at
    if not transitions.reclaim_expired(
        row,
        terminal=terminal,
        charged=row.confirmed,
        worker=worker,
        error=error,
        gone_for=gone_for,
        delay=decision.delay_seconds,
    ):
        stats.lost_races += 1
        logger.debug("job %s attempt %s: reclaim lost its race", row.id, row.attempt)
        return 0
    stats.reclaimed += 1
    stats.uncharged += not row.confirmed
    if terminal:
        tell(row.kind, row.id, row.attempt)
    # The operator's line is transitions.reclaim_expired's (structured, with the evidence).
    logger.debug(
        "job %s attempt %s: lease expired (worker %s, %s), %s",
        row.id,
        row.attempt,
        row.worker,
        "handler confirmed running" if row.confirmed else "handler never confirmed running",
        "failed (last attempt)" if terminal else "requeued",
    )
    return 1
