"""The runner: claim -> heartbeat -> handler -> classify -> exactly one fenced write.

Owns: executing claimed jobs inside a django-q2 worker process. Never: writes a job except through
jobs.worker.completer/jobs.transitions; never retries a write that was rejected; never holds a
transaction open while a handler runs.

A drain claims due jobs in batches (each row fenced by its own attempt) and runs them one by one
until the queue is idle or its time budget is spent (django-q2's bookkeeping is paid per drain).

Hazards: one job must never decide another's fate. A success is handed to the background thread,
which commits it within twice FLUSH_SECONDS whatever its batch-mates do, or when the batch ends
(jobs.worker.successes). A BaseException escaping a handler fails that job with its own error,
commits the batch's successes and releases the jobs never started -- then propagates. A SIGKILL
cannot be caught: qcluster's main process sees the worker die and reclaims its jobs at once
(jobs/worker/rescue.py; else their leases run out), charging only the attempt a heartbeat had
confirmed running (see jobs/worker/reaper.py).

A handler that runs past its execution timeout (`@handler(timeout=...)`, else Q_TIMEOUT) fails
alone: the background thread fails its attempt, settles its batch and ends this worker process,
which django-q2 replaces (jobs.worker.watchdog). One that returns right at its timeout is either
committed here or failed there, never both: whichever comes first under the drain's lock has the
attempt (jobs.worker.running).

Shutdown (jobs.worker.shutdown): once a stop is requested a drain claims nothing more and hands
back the jobs it has not started; when the grace ends with a handler still running, the drain's
background thread beats once (it ran), hands every held job back (fenced) and ends this worker
process after ABANDON_SECONDS (jobs.worker.hand_back): the abandoned handler's writes in between
change zero rows."""

import contextvars
import logging
import os
import time
import traceback
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.conf import settings
from django.db import DatabaseError, connection

from jobs.context import Held, JobContext, close_side_connection, refused_at_commit
from jobs.core import bounds, identity, policy, transitions
from jobs.core.conf import jobs_settings
from jobs.core.connectivity import OutageLog, bounded
from jobs.core.exceptions import InvalidPayload, LeaseLost, PermanentFailure, UnknownKind
from jobs.core.registry import Handler, get_handler
from jobs.core.sql.rows import JSONText
from jobs.core.transitions import Claimed
from jobs.worker import completer, hand_back, hygiene, shutdown, watchdog
from jobs.worker.heartbeat import Finished, Heartbeater
from jobs.worker.listener import IdleWait

logger = logging.getLogger("jobs.runner")

# A worker process's outages, logged once (then reminders, then the recovery) across its drains.
_WORKER_OUTAGE = OutageLog("worker drain (claim)", logger)
_LISTEN_OUTAGE = OutageLog("worker LISTEN connection", logger)


def worker_identity() -> str:
    """ "<hostname>:<pid>" of the OS process running handlers (jobs.core.identity.owner_of)."""
    return identity.owner_of(os.getpid())


class Outcome(NamedTuple):
    """What the handler's run amounted to, decided before any write (one per job). A success's
    `result` is its JSON text, checked and encoded once; a `permanent` failure is not retried."""

    succeeded: bool
    result: Any = None
    error: str = ""
    lost: bool = False
    permanent: bool = False


def execute(handler: Handler, ctx: JobContext) -> Outcome:
    """Run the handler and classify what happened; writes nothing.

    A BaseException is not classified here: it propagates to run_batch, which ends this job
    with it and hands the rest of the batch back before re-raising. A handler that leaves a
    transaction open fails, the worker's connection reset (jobs.worker.hygiene)."""
    found, outcome = hygiene.before(), None
    try:
        outcome = _classify(handler, ctx)
    finally:
        if hygiene.in_forked_child(found):  # a child the handler forked, back in its drain
            hygiene.leave_forked_child(
                ctx.job_id, ctx.attempt, outcome is not None and outcome.succeeded
            )
        left = hygiene.after(found)
    if left and not outcome.lost:
        error = f"{left}\n{outcome.error}" if outcome.error else left
        return Outcome(succeeded=False, error=error, permanent=outcome.permanent)
    return outcome


def _classify(handler: Handler, ctx: JobContext) -> Outcome:
    try:
        # In a copy of the drain's context: what it activates there (timezone.activate,
        # translation.activate, any ContextVar) ends with it, not in the worker's next job.
        result = contextvars.copy_context().run(handler.fn, ctx)
    except LeaseLost:
        return Outcome(succeeded=False, lost=True)
    except Exception as exc:  # noqa: BLE001  a handler's failure is data: classified, written once
        if refused_at_commit(ctx, exc):  # its transaction's COMMIT refused a stale token write
            return Outcome(succeeded=False, lost=True)
        error = bounds.exception_text(exc) + _hint(exc)  # its own code may raise while formatted
        return Outcome(succeeded=False, error=error, permanent=isinstance(exc, PermanentFailure))
    if result is None:
        return _RETURNED_NONE  # most handlers: nothing to check or encode
    try:
        text = bounds.json_text(result, jobs_settings().MAX_PAYLOAD_BYTES, what="result")
        return Outcome(True, JSONText(text))  # the commit sends it as it is
    except InvalidPayload as exc:
        why = str(exc)
    except Exception as exc:  # noqa: BLE001  its own code raised (items(), RecursionError, ...)
        why = bounds.exception_line(exc)  # its own code may raise while formatted
    # Not retried (as a task's UnencodableResult): a rerun would most likely return it again.
    return Outcome(False, error=f"handler returned an unusable result: {why}", permanent=True)


_RETURNED_NONE = Outcome(True, JSONText("null"))
_FAILED_UNCLASSIFIED = Outcome(False)
_DAEMONIC = "daemonic processes are not allowed to have children"
_DAEMONIC_HINT = (
    "(a handler runs in a django-q2 worker process, which is daemonic: multiprocessing's "
    "Process, Pool and ProcessPoolExecutor cannot start children there. Use subprocess "
    "(subprocess.run([sys.executable, ...])), threads for I/O, or one job per part "
    "(jobs.enqueue): docs/operations.md#what-a-handler-leaves-on-its-worker)"
)


def _hint(exc: Exception) -> str:
    """What a handler's error means where Python's own message does not say (its failure only)."""
    try:  # the handler's exception: its str() may raise (no hint then)
        daemonic = isinstance(exc, AssertionError) and _DAEMONIC in str(exc)
    except Exception:  # noqa: BLE001
        daemonic = False
    return _DAEMONIC_HINT if daemonic else ""


def drain(
    queues: Sequence[str] | None = None,
    budget_seconds: float | None = None,
    idle_wait: bool = False,
) -> int:
    """Claim and run due jobs until none is due or the budget is spent; return how many ran.

    With `idle_wait` (a worker's drain, jobs.worker.bridge) a drain that finds no work waits for new
    work (see listener.IdleWait) for up to IDLE_WAIT_SECONDS within its budget before it returns.
    """
    cfg = jobs_settings()
    queues = queues or cfg.QUEUES
    budget = budget_seconds if budget_seconds is not None else cfg.DRAIN_SECONDS
    deadline = time.monotonic() + budget
    worker, ran, size = worker_identity(), 0, 1
    hygiene.drain_starts()  # what ran before this drain may have set an alarm
    interval = policy.heartbeat_interval(cfg.LEASE_SECONDS, cfg)
    idle = IdleWait(cfg, queues, _LISTEN_OUTAGE) if idle_wait else None
    try:
        with Heartbeater(
            interval,
            completer.commit,
            hand_back.at_grace_over,
            hand_back.unstarted,
            hand_back.waiting,
        ) as beats:
            while time.monotonic() < deadline and not beats.at_risk and not shutdown.requested():
                try:
                    claim_started = time.monotonic()
                    with bounded("claim"):
                        batch = transitions.claim(
                            worker, limit=size, lease_seconds=cfg.LEASE_SECONDS, queues=queues
                        )
                    claim_seconds = time.monotonic() - claim_started
                except DatabaseError as exc:
                    if idle is None:
                        raise
                    # A worker's drain: the outage is logged once per process (not a traceback
                    # per drain task); the drain ends and the scheduler sends new ones later.
                    _WORKER_OUTAGE.failed(exc)
                    connection.close()
                    break
                if idle is not None:
                    _WORKER_OUTAGE.recovered()
                if not batch:
                    if idle is not None and idle.wait(deadline):
                        continue
                    break
                if idle is not None:
                    idle.busy(backlog=len(batch) >= size)
                started = time.monotonic()
                handlers = run_batch(batch, beats)
                ran += handlers
                # The time per handler that ran: jobs handed back unstarted (waiting behind a
                # slow batch-mate, or at a stop) took no time and must not make it look quick.
                per_job = (time.monotonic() - started) / max(1, handlers)
                size = policy.next_claim_batch(size, per_job, cfg.CLAIM_BATCH, claim_seconds)
    finally:
        if idle is not None:
            idle.close()
        close_side_connection()
    return ran


class _Kinds(dict[str, tuple[Handler | None, float | None]]):
    """A batch's kinds: handler and timeout, looked up once per known kind; an unknown one is
    looked up again (a batch-mate's handler may register it: a lazy import). A lookup that
    raises is that kind's jobs' failure (`errors`), never the whole claimed batch's."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[str, str] = {}

    def __missing__(self, kind: str) -> tuple[Handler | None, float | None]:
        try:
            handler = get_handler(kind)
            timeout = _timeout_for(handler)
        except UnknownKind:
            return None, None
        except Exception:  # noqa: BLE001  its jobs' failure (run_one), never the batch's
            self.errors[kind] = f"looking up kind {kind!r} raised:\n{traceback.format_exc()}"
            return None, None
        self.errors.pop(kind, None)
        return self.setdefault(kind, (handler, timeout))


def run_batch(batch: Sequence[Claimed], beats: Heartbeater) -> int:
    """Run each claimed job in claim order; return how many handlers ran.

    Failures are written at once, successes handed to `beats` for a prompt batched commit. If
    the leases are at risk (no beat has succeeded for a while), the jobs not yet started are
    handed back instead of started."""
    cfg, kinds = jobs_settings(), _Kinds()
    leases = [
        (c.fence, policy.lease_seconds_for(c.lease_seconds, kinds[c.kind][0], cfg)) for c in batch
    ]
    unstarted = list(zip(batch, beats.hold_many(leases), strict=True))
    current: tuple[Claimed, Held] | None = None
    ran = 0
    try:
        while unstarted and not beats.at_risk and not shutdown.requested():
            current = unstarted.pop(0)
            commit_now = run_one(*current, beats, kinds)
            if commit_now is None:
                current = None  # handed back by a stop meanwhile
                continue
            current, ran = None, ran + 1
            if commit_now:
                # It ran long enough to be confirmed (so a kill now would charge it): commit
                # before the next handler starts. No longer `current`: this commit is not its
                # handler's doing, so whatever it meets never fails the job -- an outcome still
                # unknown after UNKNOWN_OUTCOME_SECONDS is spooled (jobs.worker.unresolved) and
                # the error ends the drain; the lease decides the job meanwhile.
                beats.flush()
    except BaseException as exc:
        _abandon(current, unstarted, beats, exc)
        raise
    if unstarted:
        why = "shutting down" if shutdown.requested() else "heartbeats failing"
        logger.warning("%s: handing back %s unstarted jobs", why, len(unstarted))
        _release(unstarted, beats)
        beats.flush()
    else:
        beats.commit_soon()  # committed by the drain's thread while the next batch is claimed
    return ran


def run_one(claimed: Claimed, held: Held, beats: Heartbeater, kinds: _Kinds) -> bool | None:
    """Run one job and end its attempt, or hand its success over; True if that success must be
    committed before the next handler starts (confirmed: see run_batch), None if a stop handed
    it back before it started. Quick jobs, never confirmed, keep their batched commit."""
    handler, seconds = kinds[claimed.kind]

    def on_timeout() -> None:
        watchdog.time_out(beats, claimed, held, seconds or 0.0)

    if handler is not None and not claimed.attempts_released:
        since = beats.start(held, seconds, on_timeout)  # and named running, under one lock
    elif beats.start(held) is None:
        return None
    elif handler is None:
        beats.release(claimed.fence)
        why = kinds.errors.get(claimed.kind, f"no handler is registered for kind {claimed.kind!r}")
        completer.fail(claimed, why, held=held)
        return False
    elif not _confirm_running(claimed, beats):
        return False
    else:
        held.confirmed = True
        since = beats.running(held, seconds, on_timeout)
    if since is None:
        return None
    fence = claimed.fence
    watchdog.started(fence.job_id, fence.attempt, seconds, held.lease_seconds, since)
    outcome = _FAILED_UNCLASSIFIED  # until execute returns (a BaseException propagates)
    try:
        outcome = execute(handler, JobContext(held, claimed.kind, claimed.payload))
    finally:  # ours or its timeout's, decided once under the drain's lock (a success with it)
        success = outcome.succeeded and not outcome.lost
        done = Finished(held, claimed, outcome.result, time.monotonic()) if success else None
        ours = beats.returned(held, done)
        watchdog.ended()
    if not ours:
        return False  # failed by the background thread, which is ending this process
    if success:
        return held.confirmed
    beats.release(fence)
    if outcome.lost or held.lost.is_set():
        completer.discard(fence, held)
    else:
        completer.fail(claimed, outcome.error, permanent=outcome.permanent, held=held)
    return False


def _timeout_for(handler: Handler) -> float | None:
    """The kind's `@handler(timeout=...)`, else django-q2's Q_TIMEOUT (the longest single job)."""
    if handler.timeout is not None:
        return handler.timeout
    seconds = getattr(settings, "Q_CLUSTER", {}).get("timeout")
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None


def _confirm_running(claimed: Claimed, beats: Heartbeater) -> bool:
    # A job with an uncharged attempt behind it may be the one that killed its last worker:
    # confirm its start before it runs, so if it kills this one too the attempt is charged.
    try:
        transitions.confirm_running(claimed.fence)
        return True
    except LeaseLost:
        beats.release(claimed.fence)
        completer.discard(claimed.fence)
        return False


def _abandon(
    current: tuple[Claimed, Held] | None,
    unstarted: list[tuple[Claimed, Held]],
    beats: Heartbeater,
    exc: BaseException,
) -> None:
    """A BaseException ends the drain: settle everyone else's job before it propagates."""
    logger.error("drain interrupted by %r: settling the batch before it propagates", exc)
    steps = [beats.flush]
    if current is not None and not beats.timed_out(current[1]):  # else its timeout fails it
        claimed, held = current
        error = bounds.exception_text(exc)  # its own code may raise while formatted

        def fail_current() -> None:
            beats.release(claimed.fence)
            completer.fail(claimed, f"handler raised {type(exc).__name__}: {error}", held=held)

        steps.append(fail_current)
    steps.append(lambda: _release(unstarted, beats))
    for step in steps:
        try:
            step()
        except Exception:  # noqa: BLE001  best effort: each job not settled here expires
            logger.exception("could not settle part of an interrupted batch")


def _release(unstarted: list[tuple[Claimed, Held]], beats: Heartbeater) -> None:
    for claimed, held in unstarted:
        if not beats.holds(held):
            continue  # already handed back (a stop)
        beats.release(claimed.fence)
        completer.release(claimed)
    unstarted.clear()
