"""The completer: how a worker ends its attempts -- commit, fail, release, discard.

Owns: the final write of every attempt a drain ran, and what happens around it: committing a
drain's successes together (every row fenced by its own attempt), isolating a row the database
refuses so it fails alone, and resolving a write whose outcome is unknown before anything is
reported. Writes only through jobs.core.transitions.

Never: lets one job's value or failure decide another job's outcome. A batch statement the
database refuses is split until the refused row stands alone; that row's job fails with the
database's reason and every other row commits. Never retries a write that was rejected (zero
rows): that is a lost lease, recorded by transitions.

Hazards: a connection lost during the write leaves its outcome unknown. The attempt's own
Attempt row, re-read on a fresh connection, decides: only this attempt's own write sets its
outcome to `succeeded`/`failed`/`released` (the job's state cannot tell: a reaper's requeue and a
retrying fail both leave it queued at the same attempt). Until the outcome is known nothing is
reported. Every presentation and re-read is bounded (jobs.core.connectivity), and the whole
resolution by JOBS["UNKNOWN_OUTCOME_SECONDS"] (60 s): past it the write is spooled
(jobs.worker.unresolved) so the operator sees it once the database is back, with the outcome then
read from the database, and the error propagates; the lease decides the job meanwhile.
"""

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from jobs.context import Held, record_unrecorded_rejection
from jobs.core import policy, registry, transitions
from jobs.core.conf import jobs_settings
from jobs.core.connectivity import bounded
from jobs.core.exceptions import LeaseLost, UnknownKind
from jobs.core.registry import Handler, get_handler
from jobs.core.states import AttemptOutcome
from jobs.core.transitions import Claimed, Fence
from jobs.effects import pending, staging
from jobs.worker import unresolved
from jobs.worker.heartbeat import Finished

logger = logging.getLogger("jobs.completer")


def _ids(fence: Fence) -> tuple[int, int]:
    return fence.job_id, fence.attempt


# SQLSTATE classes that speak of the connection or the server, never of the row presented: an
# invalid transaction state (25: a read-only session -- a handler's SET, a failover onto a
# standby -- or a failed transaction), a connection exception (08), insufficient resources
# (53), operator intervention (57). Such a write is presented again on a fresh connection, as
# if the connection had died; the job is not failed for it.
_UNFIT = ("25", "08", "53", "57")


def _unfit(exc: DatabaseError) -> bool:
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    return str(getattr(exc.__cause__, "sqlstate", None) or "")[:2] in _UNFIT


def _refused(exc: DatabaseError) -> bool:
    """The database refused what was presented (its data), not the connection it came on."""
    return not _unfit(exc)


def commit(items: Sequence[Finished]) -> None:
    """Commit finished successes; a lost lease discards, a refused row fails its own job.

    The successes first: a lost attempt's end is one try, and its error (a connection that died
    under it) must not drop its batch-mates' commits, which re-read and present again. Each
    discard is tried whatever happened to the others and to the commit; one that fails is logged
    (its attempt was already ended by whoever took the job over, or is left to the janitor)."""
    lost: list[Held] = []
    kept: list[Finished] = []
    for item in items:  # one pass (a commit's per-job work is on the drain's hot path)
        if item.held.lost.up:
            lost.append(item.held)
        else:
            kept.append(item)
    try:
        _commit_isolated(kept)
    finally:
        for held in lost:
            fence = held.fence
            try:
                discard(fence, held)
            except Exception:  # noqa: BLE001  this attempt's own clean-up; the others go on
                logger.exception("job %s attempt %s: could not end its lost attempt", *_ids(fence))


def _commit_isolated(items: Sequence[Finished]) -> None:
    if not items:
        return
    by_job = {i.held.fence.job_id: i for i in items}

    def write(fences: Sequence[Fence]) -> None:
        helds = [by_job[f.job_id].held for f in fences]
        rows, intents = _promotions(fences, helds, by_job)
        rejected = transitions.commit_many(rows, intents)
        for fence in rejected:  # each already logged once, on the fencing line
            logger.debug("job %s attempt %s: commit rejected; work discarded", *_ids(fence))
            _settle_unpromoted(fence, by_job[fence.job_id].held)
        pending.forget_many(helds)
        hooked: dict[str, bool] = {}  # kind -> whether it has an on_finished hook
        for fence in fences:
            kind = by_job[fence.job_id].claimed.kind
            if kind not in hooked:
                hooked[kind] = registry.has_on_finished(kind)
            if hooked[kind] and fence not in rejected:
                _tell_finished(kind, fence, succeeded=True)

    try:
        present_until_decided([i.held.fence for i in items], write, AttemptOutcome.SUCCEEDED)
    except DatabaseError as exc:
        if not _refused(exc):
            raise
        if len(items) > 1:  # someone's row was refused: find it, commit the others
            half = len(items) // 2
            _commit_isolated(items[:half])
            _commit_isolated(items[half:])
            return
        fence = items[0].held.fence
        logger.warning("job %s attempt %s: result refused by the database: %s", *_ids(fence), exc)
        fail(
            items[0].claimed,
            f"the database refused the handler's result: {exc}",
            held=items[0].held,
        )


def _promotions(
    fences: Sequence[Fence], helds: Sequence[Held], by_job: dict[int, Finished]
) -> tuple[list[tuple[Fence, Any, str]], dict[int, list[Any]]]:
    """Each attempt's commit row -- its result and its own staged prefix (result_ref) -- and its
    intents, read for the whole batch under one lock."""
    recorded = pending.peek_many(helds)
    rows: list[tuple[Fence, Any, str]] = []
    intents: dict[int, list[Any]] = {}
    for f in fences:
        work = recorded.get(f.job_id)
        ref = ""
        if work is not None:
            if work.staged:
                ref = staging.prefix(f.job_id, f.attempt)
            if work.intents:
                intents[f.job_id] = list(work.intents.values())
        rows.append((f, by_job[f.job_id].result, ref))
    return rows, intents


def _settle_unpromoted(fence: Fence, held: Held | None) -> None:
    """The attempt's final write is decided and was not a commit: delete its own outputs (and
    end its work in memory, where the caller holds it: a leaked thread's record is refused)."""
    if held is not None:
        pending.forget(held)
    try:
        staging.discard_own(fence)
    except DatabaseError:
        logger.exception("job %s attempt %s: staged outputs left to the janitor", *_ids(fence))


def fail(
    claimed: Claimed, error: str, *, permanent: bool = False, held: Held | None = None
) -> None:
    """End an attempt as failed, retried with backoff while charged attempts remain (none for a
    `permanent` failure: the handler raised PermanentFailure). `held`: what the drain holds for
    it, whose recorded work ends with it."""
    fence, cfg = claimed.fence, jobs_settings()
    limit = policy.max_attempts_for(claimed.max_attempts, _handler(claimed.kind), cfg)
    charged = policy.charged_attempts(fence.attempt, claimed.attempts_released)
    jitter = random.random()
    decision = policy.decide_failure(charged, limit, cfg, jitter=jitter, permanent=permanent)
    retry_in = decision.delay_seconds if decision.retry else None

    def write(fences: Sequence[Fence]) -> None:
        try:
            transitions.fail(fence, error, retry_in)
        except DatabaseError as exc:
            if not _refused(exc):
                raise
            # storable_error() makes text storable; whatever else was refused, the job still
            # ends, with the reason it could not end as told.
            transitions.fail(fence, f"the database refused the error text: {exc}", retry_in)

    try:
        present_until_decided([fence], write, AttemptOutcome.FAILED)
    except LeaseLost as exc:  # the fencing line (jobs.fencing) already told the operator
        logger.debug("job %s attempt %s: %s; work discarded", *_ids(fence), exc)
        _settle_unpromoted(fence, held)
        return
    _settle_unpromoted(fence, held)
    if retry_in is None:
        _tell_finished(claimed.kind, fence, succeeded=False)
    if retry_in is not None:
        logger.info(
            "job %s (%s) attempt %s failed, retry in %.1f s: %s",
            fence.job_id,
            claimed.kind,
            fence.attempt,
            retry_in,
            _one_line(error),
        )
    else:
        logger.warning(
            "job %s (%s) attempt %s failed for good (%s of %s attempts%s): %s",
            fence.job_id,
            claimed.kind,
            fence.attempt,
            charged,
            limit,
            "; permanent, not retried" if permanent else "",
            _one_line(error),
        )


def _one_line(error: str, limit: int = 200) -> str:
    """The last line of an error (a traceback's exception), printable and bounded, for a log."""
    lines = [line for line in error.splitlines() if line.strip()] or ["(no error text)"]
    last = lines[-1].strip()
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in last)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def release(claimed: Claimed) -> None:
    """Hand back a claimed job whose handler never started (uncharged)."""
    fence = claimed.fence
    try:
        present_until_decided(
            [fence], lambda fences: transitions.release(fence), AttemptOutcome.RELEASED
        )
        logger.info("job %s attempt %s: released unstarted", *_ids(fence))
    except LeaseLost as exc:  # logged on the fencing line
        logger.debug("job %s attempt %s: %s", *_ids(fence), exc)


def hand_back(fence: Fence, why: str = "at shutdown", level: int = logging.WARNING) -> bool:
    """Hand back a held job from the drain's background thread: at shutdown (its handler is
    abandoned), or a batch-mate that waited behind a slow handler. A fenced release, one bounded
    try -- the thread must not hang on it. True once decided (handed back, or the lease was
    already gone); False if the database did not answer: the caller keeps the job held and tries
    again (a batch-mate), or lets the lease decide (shutdown)."""
    try:
        with bounded(f"release of job {fence.job_id} attempt {fence.attempt}"):
            transitions.release(fence)
        logger.log(level, "job %s attempt %s: handed back %s", *_ids(fence), why)
    except LeaseLost as exc:
        logger.info("job %s attempt %s: %s", *_ids(fence), exc)
    except DatabaseError as exc:
        connection.close()  # the next try gets a fresh connection
        logger.error(
            "job %s attempt %s: could not hand back %s (%s: %s)",
            *_ids(fence),
            why,
            type(exc).__name__,
            _one_line(str(exc)),
        )
        return False
    return True


def discard(fence: Fence, held: Held | None = None) -> None:
    # The lost lease is already recorded (and logged) by whichever fenced write saw it -- or,
    # seen inside the handler's own transaction on SQLite, is recorded now that it is over.
    record_unrecorded_rejection(fence)
    logger.debug("job %s attempt %s: lease lost, work discarded", *_ids(fence))
    with bounded(f"end of job {fence.job_id} attempt {fence.attempt} as lost"):
        transitions.mark_lost(fence)
    _settle_unpromoted(fence, held)


def _tell_finished(kind: str, fence: Fence, *, succeeded: bool) -> None:
    """The job's final write landed: its kind's hook hears of it (jobs.tasks sends
    task_finished). Never for a rejected write; a hook's failure never changes the outcome, nor
    stops the thread that told it -- a SystemExit too (it would have ended the drain's background
    thread silently: its batch-mates' leases then ran out). Only an interrupt (Ctrl-C) goes on."""
    try:
        registry.finished(kind, fence.job_id, fence.attempt, succeeded)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001  the write has landed; a hook cannot undo or redo it
        logger.exception("job %s attempt %s: the on_finished hook failed", *_ids(fence))


def _handler(kind: str) -> Handler | None:
    try:
        return get_handler(kind)
    except UnknownKind:
        return None
    except Exception:  # noqa: BLE001  a lookup that raises (a resolver's import): its defaults
        logger.warning("looking up the handler of kind %r raised", kind, exc_info=True)
        return None


def present_until_decided(
    fences: Sequence[Fence], write: Callable[[Sequence[Fence]], Any], landed: str
) -> None:
    """Run a final write; if the connection died under it, learn the outcome before going on.

    Each attempt is re-read on a fresh connection: its own Attempt row already `landed` means the
    write landed; the others are presented again, and the fenced statement decides (landing, or
    a recorded rejection -- unless the earlier presentation landed meanwhile, which
    jobs.core.transitions recognises as this attempt's own write).
    """
    deadline = time.monotonic() + jobs_settings().UNKNOWN_OUTCOME_SECONDS
    remaining = list(fences)
    while remaining:
        try:
            with bounded(f"final write ({landed}) of {len(remaining)} attempts"):
                write(remaining)
            return
        except DatabaseError as exc:
            if not _unfit(exc):
                raise
            if time.monotonic() > deadline:
                unresolved.record(remaining, landed)
                raise
            logger.warning(
                "connection %s during the final write of %s; re-reading: %s",
                "lost" if isinstance(exc, OperationalError | InterfaceError) else "unfit",
                ", ".join(f"job {f.job_id} attempt {f.attempt}" for f in remaining),
                _one_line(str(exc)),
            )
            connection.close()
        still = []
        for fence in remaining:
            try:
                outcome = _read_on_fresh_connection(fence, deadline)
            except (OperationalError, InterfaceError):
                unresolved.record(remaining, landed)
                raise
            if outcome == landed:
                logger.info("job %s attempt %s: the write had landed", *_ids(fence))
            else:
                still.append(fence)
        remaining = still


def _read_on_fresh_connection(fence: Fence, deadline: float) -> str | None:
    pause = 0.05
    while True:
        try:
            with bounded(f"re-read of job {fence.job_id} attempt {fence.attempt}"):
                return transitions.attempt_outcome(fence)
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)  # waiting for the database to come back, not for a condition
            pause = min(pause * 2, 2.0)
