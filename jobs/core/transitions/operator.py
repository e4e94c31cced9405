"""Operator transitions: requeue, cancel, retry now (admin, dashboard and `manage.py jobs`).

An operator's write is fenced like a worker's: the row is locked (FOR UPDATE) and read,
the decision is made on what was read, and the filtered UPDATE carries the fence (id, attempt,
state as read), so a claim, commit or reclaim that slipped in makes it change zero rows: the
job is then skipped ("changed meanwhile"), never overwritten. Taking a running job away ends
its attempt (`requeued`/`cancelled`); that worker's next heartbeat or commit changes zero rows
and is recorded like any zombie's. An operator's requeue gives the job a fresh budget of
attempts (every earlier claim counts as released), so a job that exhausted max_attempts runs
again.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction

from jobs.core.sql import dumps
from jobs.core.sql.operator import ATTEMPT, CLOCK, close_running_attempt, lock_job, update_fenced
from jobs.core.states import AttemptOutcome, EventType, JobState
from jobs.core.transitions.fence import driver

logger = logging.getLogger("jobs.fencing")


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


# A plan: what to write for the (state, attempt) read -- column values, the event, the outcome of
# the running attempt it takes away (None: no attempt is running) -- or why the job is skipped.
Plan = Callable[[str, int], "tuple[dict[str, Any], str, str | None] | str"]


def _operator_write(job_id: int, action: str, actor: str, plan: Plan) -> OperatorResult:
    sql = driver()
    state, attempt = "", 0
    try:
        with transaction.atomic(), connection.cursor() as cur:
            row = lock_job(sql, cur, job_id)
            if row is None:
                return OperatorResult(job_id, action, False, "no such job")
            state, attempt = row
            decided = plan(state, attempt)
            if isinstance(decided, str):
                return OperatorResult(job_id, action, False, decided, state, attempt)
            values, event, outcome = decided
            due_later = bool(values.pop(_DUE_LATER, False))
            fence = (job_id, attempt, state)
            if update_fenced(sql, cur, fence, values, only_if_due_later=due_later) != 1:
                reason = "already due" if due_later else "changed meanwhile"
                return OperatorResult(job_id, action, False, reason, state, attempt)
            data = dumps({"by": actor[:200], "action": action, "from": state})
            if outcome is not None:
                note = f"{action} by {actor[:200]}"
                close_running_attempt(sql, cur, job_id, attempt, outcome, note)
            sql.insert_event(cur, job_id, attempt, event, actor[:200], data)
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
        job_id, action, True, f"{state} -> {values.get('state', state)}", state, attempt
    )


_DUE_LATER = "_only_if_due_later"  # a plan's flag: change the row only while its run_at is ahead


def _back_to_queue(state: str) -> dict[str, Any]:
    return {
        "state": JobState.QUEUED,
        "run_at": CLOCK,
        "lease_expires_at": None,
        "finished_at": None,
        "attempts_released": ATTEMPT,  # a fresh budget: earlier claims no longer count
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
            "finished_at": CLOCK,
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

    def plan(state: str, attempt: int) -> tuple[dict[str, Any], str, str | None] | str:
        if state == JobState.FAILED:
            return _back_to_queue(state), EventType.REQUEUED, None
        if state == JobState.QUEUED:
            # Decided in the UPDATE: only a row whose run_at is still ahead moves.
            return (
                {"run_at": CLOCK, _DUE_LATER: True},
                EventType.REQUEUED,
                None,
            )
        return f"{state}: only failed or waiting jobs are retried"

    return _operator_write(job_id, "retry", actor, plan)
