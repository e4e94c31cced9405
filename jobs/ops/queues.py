"""Queue controls for operators: pause, resume, a concurrency limit per queue -- and reading them.

Owns: validating a control change, writing it (one durable row per queue, jobs.QueueControl), the
audit trail (Django's LogEntry when a user acts, and one log line always) and the wake-up a
resume sends. The admin, `manage.py jobs queues` and the dashboard call these functions.

Never: stops or touches a job. A pause only makes claims skip the queue (running jobs finish); a
limit only makes claims take no more than it allows. Both are enforced by the claim statement
itself (jobs/core/sql), which reads the row on every claim: cluster-wide, within one claim, and
durable across restarts.

Hazards: a limit lower than the jobs running now stops nothing -- claims from the queue wait
until fewer than the limit run.
"""

import logging
from dataclasses import dataclass
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction

from jobs.core import identity
from jobs.core.enqueue import QUEUE_NAME
from jobs.core.sql import driver_for
from jobs.core.sql import queues as sql
from jobs.models.queue import LIMIT_RANGE
from jobs.models.queue import QueueControl as QueueControlRow
from jobs.ops.actions import may_act

logger = logging.getLogger("jobs.queues")


@dataclass(frozen=True)
class QueueControl:
    """A queue's controls as the screens show them."""

    paused: bool = False
    limit: int | None = None


def pause(name: str, *, actor: Any) -> bool:
    """Claims stop taking jobs of `name` (running ones finish). True if it was not paused."""
    return _set_paused(name, True, actor)


def resume(name: str, *, actor: Any) -> bool:
    """Claims take jobs of `name` again; its workers are woken at once. True if it was paused."""
    return _set_paused(name, False, actor)


def set_limit(name: str, limit: int | None, *, actor: Any) -> None:
    """At most `limit` jobs of `name` running at once across every cluster; None: no limit."""
    validate_name(name)
    validate_limit(limit)
    by = _check_actor(actor)
    driver = driver_for(connection.vendor)
    with transaction.atomic(), connection.cursor() as cur:
        previous = sql.set_limit(driver, cur, name, limit, by)
        if limit is None or (previous is not None and limit > previous):
            sql.wake(driver, cur, name)  # more room: waiting work may start now
        if previous != limit:
            _audit(actor, name, f"concurrency limit {_limit(previous)} -> {_limit(limit)}")
    logger.info("queue %s: concurrency limit %s (by %s)", name, _limit(limit), by)


def controls() -> dict[str, QueueControl]:
    """Every queue an operator paused or limited; a queue missing here is neither."""
    with connection.cursor() as cur:
        rows = sql.controls(cur)
    return {q: QueueControl(paused, limit) for q, paused, limit in rows if paused or limit}


def running() -> dict[str, int]:
    """Jobs running now, per queue (for the metrics and the CLI)."""
    with connection.cursor() as cur:
        return sql.running_per_queue(cur)


def _set_paused(name: str, paused: bool, actor: Any) -> bool:
    validate_name(name)
    by = _check_actor(actor)
    driver = driver_for(connection.vendor)
    with transaction.atomic(), connection.cursor() as cur:
        changed = sql.set_paused(driver, cur, name, paused, by)
        if changed:
            if not paused:
                sql.wake(driver, cur, name)
            _audit(actor, name, "paused" if paused else "resumed")
    verb = "paused" if paused else "resumed"
    if changed:
        logger.info("queue %s %s (by %s)", name, verb, by)
    return changed


def validate_limit(limit: Any) -> None:
    """A limit is None (no limit) or a whole number in LIMIT_RANGE; else a clear ValueError."""
    if limit is not None and (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not LIMIT_RANGE[0] <= limit <= LIMIT_RANGE[1]
    ):
        raise ValueError(
            f"a concurrency limit is a whole number from {LIMIT_RANGE[0]} to {LIMIT_RANGE[1]} "
            f"(or None for no limit), not {limit!r}; to run none of a queue, pause it"
        )


def validate_name(name: Any) -> None:
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise ValueError(
            f"queue {name!r:.80} is not a queue name: it must match {QUEUE_NAME.pattern}"
        )


def _check_actor(actor: Any) -> str:
    """Who acts, as stored on the row: a permitted Django user, or the CLI (None)."""
    if actor is None:
        return f"cli ({identity.os_user()})"[:200]
    if not may_act(actor):
        raise PermissionError(f"{actor} may not control queues (needs staff and jobs.change_job)")
    return str(actor.get_username())[:200]


def _limit(limit: int | None) -> str:
    return "none" if limit is None else str(limit)


def _audit(actor: Any, name: str, message: str) -> None:
    """A LogEntry per change a user made (the CLI's changes: the log line and the row's
    changed_by), written in the change's transaction: no change without its audit."""
    if actor is None:
        return
    LogEntry.objects.create(
        user_id=actor.pk,
        content_type=ContentType.objects.get_for_model(QueueControlRow),
        object_id=name,
        object_repr=f"queue {name}",
        action_flag=CHANGE,
        change_message=message,
    )
