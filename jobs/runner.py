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
    deadline = time.monotonic() + (
        budget_seconds if budget_seconds is not None else cfg.DRAIN_SECONDS
    )
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
            held = [beats.hold(c.fence, _lease_for(c)) for c in batch]
            for claimed, h in zip(batch, held, strict=True):
                run_claimed(claimed, h, beats)
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


def run_claimed(claimed: Claimed, held: Held, beats: Heartbeater) -> None:
    fence = claimed.fence
    handler: Handler | None
    try:
        handler = get_handler(claimed.kind)
    except UnknownKind as exc:
        handler, outcome = None, Outcome(succeeded=False, error=str(exc))
    else:
        outcome = execute(handler, JobContext(held, claimed.kind, claimed.payload))
    beats.release(fence)
    if outcome.lost or held.lost.is_set():
        # The lost lease is already recorded by whichever write saw it; discard the work.
        logger.info("job %s attempt %s: lease lost, work discarded", fence.job_id, fence.attempt)
        transitions.mark_lost(fence)
        return
    try:
        settle(claimed, handler, outcome)
    except LeaseLost as exc:
        logger.info("job %s attempt %s: %s; work discarded", fence.job_id, fence.attempt, exc)


def settle(claimed: Claimed, handler: Handler | None, outcome: Outcome) -> None:
    """Make the one write that ends this attempt."""
    fence = claimed.fence
    if outcome.succeeded:
        write_resolving(
            fence, lambda: transitions.commit(fence, outcome.result), JobState.SUCCEEDED
        )
        return
    cfg = jobs_settings()
    limit = policy.max_attempts_for(claimed.max_attempts, handler, cfg)
    decision = policy.decide_failure(fence.attempt, limit, cfg, jitter=random.random())
    retry_in = decision.delay_seconds if decision.retry else None
    landed = JobState.QUEUED if decision.retry else JobState.FAILED
    write_resolving(fence, lambda: transitions.fail(fence, outcome.error, retry_in), landed)


def write_resolving(fence: Fence, write: Callable[[], None], landed_state: str) -> None:
    """Run a final write; if the connection died mid-commit, learn the outcome before going on.

    A lost connection during COMMIT leaves the outcome unknown. Re-read the job on a fresh
    connection: our attempt already in `landed_state` means it landed; otherwise the write is
    presented again, and the fenced statement decides (landing, or a recorded rejection).
    """
    deadline = time.monotonic() + UNKNOWN_OUTCOME_DEADLINE
    while True:
        try:
            write()
            return
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            logger.warning(
                "job %s attempt %s: connection lost during the final write; re-reading",
                fence.job_id,
                fence.attempt,
            )
            connection.close()
        seen = _read_on_fresh_connection(fence.job_id, deadline)
        if seen is not None and seen[1] == fence.attempt and seen[0] == landed_state:
            logger.info("job %s attempt %s: the write had landed", fence.job_id, fence.attempt)
            return


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
