"""The runner: claim -> heartbeat -> handler -> classify -> exactly one fenced write.

Owns: executing claimed jobs inside a django-q2 worker process. Never: writes a job except through
jobs.transitions; never retries a write that was rejected; never holds a transaction open while a
handler runs.

A drain claims due jobs in small batches (each row fenced by its own attempt) and runs them one by
one until the queue is idle or its time budget is spent, so django-q2's per-task bookkeeping is
paid per drain, not per job.
"""

import logging
import os
import random
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import InterfaceError, OperationalError, connection

from jobs import policy, transitions
from jobs.conf import jobs_settings
from jobs.context import JobContext
from jobs.enqueuer import encode_payload
from jobs.exceptions import InvalidPayload, LeaseLost, UnknownKind
from jobs.heartbeat import Heartbeater, Held
from jobs.registry import Handler, get_handler
from jobs.states import JobState
from jobs.transitions import Claimed, Fence

logger = logging.getLogger("jobs.runner")

ERROR_LIMIT = 10_000
UNKNOWN_OUTCOME_DEADLINE = 60.0


def worker_identity() -> str:
    """ "<hostname>:<pid>" of the OS process running handlers."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Outcome:
    """What the handler's run amounted to, decided before any write."""

    succeeded: bool
    result: Any = None
    error: str = ""
    lost: bool = False


def execute(handler: Handler, ctx: JobContext) -> Outcome:
    """Run the handler and classify what happened; writes nothing."""
    try:
        result = handler.fn(ctx)
    except LeaseLost:
        return Outcome(succeeded=False, lost=True)
    except Exception:  # noqa: BLE001  a handler's failure is data: classified, then written once
        return Outcome(succeeded=False, error=traceback.format_exc()[-ERROR_LIMIT:])
    try:
        encode_payload(result, jobs_settings().MAX_PAYLOAD_BYTES)
    except InvalidPayload as exc:
        return Outcome(succeeded=False, error=f"handler returned an unusable result: {exc}")
    return Outcome(succeeded=True, result=result)


def drain(queues: Sequence[str] | None = None, budget_seconds: float | None = None) -> int:
    """Claim and run due jobs until none is due or the budget is spent; return how many ran."""
    cfg = jobs_settings()
    queues = queues or cfg.QUEUES
    budget = budget_seconds if budget_seconds is not None else cfg.DRAIN_SECONDS
    deadline = time.monotonic() + budget
    worker = worker_identity()
    ran, size = 0, 1
    with Heartbeater(policy.heartbeat_interval(cfg.LEASE_SECONDS, cfg)) as beats:
        while time.monotonic() < deadline:
            batch = transitions.claim(
                worker, limit=size, lease_seconds=cfg.LEASE_SECONDS, queues=queues
            )
            if not batch:
                break
            started = time.monotonic()
            run_batch(batch, beats)
            ran += len(batch)
            per_job = (time.monotonic() - started) / len(batch)
            size = policy.next_claim_batch(size, per_job, cfg.CLAIM_BATCH)
    return ran


def _lease_for(claimed: Claimed) -> float:
    try:
        handler: Handler | None = get_handler(claimed.kind)
    except UnknownKind:
        handler = None
    return policy.lease_seconds_for(claimed.lease_seconds, handler, jobs_settings())


def run_batch(batch: Sequence[Claimed], beats: Heartbeater) -> None:
    """Run each claimed job; failures are written at once, successes committed together.

    Successful attempts stay held (heartbeated) until their commit, which is one statement
    for the whole batch -- one WAL flush instead of one per job -- with every row still fenced
    by its own attempt.
    """
    held = [beats.hold(c.fence, _lease_for(c)) for c in batch]
    successes: list[tuple[Claimed, Held, Any]] = []
    for claimed, h in zip(batch, held, strict=True):
        handler, outcome = run_handler(claimed, h)
        if outcome.succeeded and not outcome.lost:
            successes.append((claimed, h, outcome.result))
            continue
        beats.release(claimed.fence)
        if outcome.lost or h.lost.is_set():
            _discard(claimed.fence)
        else:
            _fail(claimed, handler, outcome.error)
    to_commit = []
    for claimed, h, result in successes:
        beats.release(claimed.fence)
        if h.lost.is_set():
            _discard(claimed.fence)
        else:
            to_commit.append((claimed.fence, result))
    if to_commit:
        _commit(to_commit)


def run_handler(claimed: Claimed, held: Held) -> tuple[Handler | None, Outcome]:
    try:
        handler = get_handler(claimed.kind)
    except UnknownKind as exc:
        return None, Outcome(succeeded=False, error=str(exc))
    return handler, execute(handler, JobContext(held, claimed.kind, claimed.payload))


def _discard(fence: Fence) -> None:
    # The lost lease is already recorded by whichever fenced write saw it.
    logger.info("job %s attempt %s: lease lost, work discarded", fence.job_id, fence.attempt)
    transitions.mark_lost(fence)


def _commit(items: Sequence[tuple[Fence, Any]]) -> None:
    results = {f.job_id: result for f, result in items}

    def write(fences: Sequence[Fence]) -> None:
        rejected = transitions.commit_many([(f, results[f.job_id], "") for f in fences])
        for fence in rejected:
            logger.info("job %s attempt %s: commit rejected; work discarded", *_ids(fence))

    present_until_decided([f for f, _ in items], write, JobState.SUCCEEDED)


def _fail(claimed: Claimed, handler: Handler | None, error: str) -> None:
    fence, cfg = claimed.fence, jobs_settings()
    limit = policy.max_attempts_for(claimed.max_attempts, handler, cfg)
    decision = policy.decide_failure(fence.attempt, limit, cfg, jitter=random.random())
    retry_in = decision.delay_seconds if decision.retry else None
    landed = JobState.QUEUED if decision.retry else JobState.FAILED
    try:
        present_until_decided(
            [fence], lambda fences: transitions.fail(fence, error, retry_in), landed
        )
    except LeaseLost as exc:
        logger.info("job %s attempt %s: %s; work discarded", *_ids(fence), exc)


def _ids(fence: Fence) -> tuple[int, int]:
    return fence.job_id, fence.attempt


def present_until_decided(
    fences: Sequence[Fence], write: Callable[[Sequence[Fence]], None], landed_state: str
) -> None:
    """Run a final write; if the connection died under it, learn the outcome before going on.

    A connection lost while the write commits leaves its outcome unknown. Re-read each job on a
    fresh connection: our attempt already in `landed_state` means it landed; the others are
    presented again, and the fenced statement decides (landing, or a recorded rejection).
    Nothing is reported or cleaned up before the outcome is known.
    """
    deadline = time.monotonic() + UNKNOWN_OUTCOME_DEADLINE
    remaining = list(fences)
    while remaining:
        try:
            write(remaining)
            return
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            logger.warning(
                "connection lost during the final write of %s; re-reading",
                ", ".join(f"job {f.job_id} attempt {f.attempt}" for f in remaining),
            )
            connection.close()
        still = []
        for fence in remaining:
            seen = _read_on_fresh_connection(fence.job_id, deadline)
            if seen is not None and seen[1] == fence.attempt and seen[0] == landed_state:
                logger.info("job %s attempt %s: the write had landed", *_ids(fence))
            else:
                still.append(fence)
        remaining = still


def _read_on_fresh_connection(job_id: int, deadline: float) -> tuple[str, int, str] | None:
    pause = 0.05
    while True:
        try:
            return transitions.read_outcome(job_id)
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)  # waiting for the database to come back, not for a condition
            pause = min(pause * 2, 2.0)
