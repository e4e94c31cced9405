"""The handler registry: kind -> handler function and its policy.

Owns: `@handler` and lookup. Handlers live in `handlers.py` of any installed app and are imported
by autodiscover() from JobsConfig.ready(), like admin.py. Never: touches the database.

Two hooks for kinds registered by a layer above (jobs.tasks registers each `@task` as the kind
named by its module path): `on_finished(job_id, attempt, succeeded)`, which the worker calls once
a kind's final write (commit, or the failure that ends the job) has landed; and resolvers, which
`get_handler` asks about a kind it does not know yet (a task whose module this process has not
imported) before it raises UnknownKind. And exit hooks (`add_exit_hook`), which a process that
ends through os._exit -- a timed-out worker, a worker abandoning its handler at the end of a
stop's grace, qcluster's main process -- runs first (`before_exit`), each bounded by
EXIT_HOOK_SECONDS: jobs.tasks sends the task_finished notices still queued.
"""

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import autodiscover_modules

from jobs.core import bounds
from jobs.core.exceptions import HandlerAlreadyRegistered, InvalidOption, UnknownKind

# fn(ctx) -> JSON-able result. `ctx` is a jobs.context.JobContext; it is left untyped here
# so the core never imports the worker, which builds it (checked by import-linter).
HandlerFn = Callable[[Any], Any]
# on_finished(job_id, attempt, succeeded): called once the final write of such a job landed.
FinishedHook = Callable[[int, int, bool], None]
logger = logging.getLogger("jobs.registry")
KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}\Z")  # \Z: "$" allows a final "\n"


@dataclass(frozen=True)
class Handler:
    kind: str
    fn: HandlerFn
    lease_seconds: float | None = None
    max_attempts: int | None = None
    cron: str | None = None  # a recurring schedule named after the kind (jobs.ops.cron)
    timezone: str = "UTC"
    on_finished: FinishedHook | None = None
    # Longest one attempt's handler may run before the attempt fails ("exceeded the task
    # timeout of N s") and its worker process is replaced; None: django-q2's Q_TIMEOUT.
    timeout: float | None = None


TIMEOUT_SECONDS = (0.5, 7 * 24 * 3600.0)  # the range of @handler(timeout=...)


_handlers: dict[str, Handler] = {}
_resolvers: list[Callable[[str], None]] = []


def handler(
    kind: str,
    *,
    lease_seconds: float | None = None,
    max_attempts: int | None = None,
    cron: str | None = None,
    timezone: str = "UTC",
    on_finished: FinishedHook | None = None,
    timeout: float | None = None,
) -> Callable[[HandlerFn], HandlerFn]:
    """Register `fn(ctx) -> JSON-able result` as the handler for `kind`."""
    if not isinstance(kind, str) or not KIND.match(kind):
        raise InvalidOption(f"a handler kind must match {KIND.pattern}, not {kind!r}")
    if lease_seconds is not None:
        bounds.lease_seconds(lease_seconds)
    if max_attempts is not None:
        bounds.max_attempts(max_attempts)
    if cron is not None:
        _check_schedule(cron, timezone)
    if timeout is not None:
        bounds.number_in("timeout", timeout, TIMEOUT_SECONDS, integer=False)

    def register(fn: HandlerFn) -> HandlerFn:
        existing = _handlers.get(kind)
        if existing is not None and existing.fn is not fn:
            qualname = f"{existing.fn.__module__}.{existing.fn.__qualname__}"
            raise HandlerAlreadyRegistered(f"kind {kind!r} is already handled by {qualname}")
        lease = float(lease_seconds) if lease_seconds is not None else None
        limit = float(timeout) if timeout is not None else None
        _handlers[kind] = Handler(
            kind, fn, lease, max_attempts, cron, timezone, on_finished, timeout=limit
        )
        return fn

    return register


def _check_schedule(cron: object, timezone: object) -> None:
    from datetime import UTC, datetime

    from jobs.core import crontab  # croniter, only for a module that declares a schedule

    crontab.check(cron, timezone, datetime.now(UTC))  # refuses one that never fires, too


def get_handler(kind: str) -> Handler:
    if not isinstance(kind, str) or not KIND.match(kind):  # no handler's: no resolver is asked
        raise UnknownKind(f"no handler is registered for kind {repr(kind)[:200]}")
    found = _handlers.get(kind)
    if found is None:
        for resolve in _resolvers:  # may register `kind` (e.g. by importing a task's module)
            resolve(kind)
        found = _handlers.get(kind)
    if found is None:
        raise UnknownKind(f"no handler is registered for kind {kind!r}")
    return found


def add_resolver(resolve: Callable[[str], None]) -> None:
    """`resolve(kind)` is asked about an unknown kind and may register it; never raises."""
    if resolve not in _resolvers:
        _resolvers.append(resolve)


# How long one exit hook may keep an ending process (a stuck hook must not keep it alive).
EXIT_HOOK_SECONDS = 2.0
_exit_hooks: list[Callable[[], object]] = []


def add_exit_hook(hook: Callable[[], object]) -> None:
    """`hook()` runs before this process ends through os._exit; it returns within
    EXIT_HOOK_SECONDS."""
    if hook not in _exit_hooks:
        _exit_hooks.append(hook)


def before_exit() -> None:
    """Run the exit hooks; a hook that raises is logged and the others still run."""
    for hook in list(_exit_hooks):
        try:
            hook()
        except Exception:  # noqa: BLE001  the process is ending: nothing may stop it
            logger.exception("an exit hook failed")


def has_on_finished(kind: str) -> bool:
    """Whether the kind has an `on_finished` hook (the completer asks once per batch and kind)."""
    found = _handlers.get(kind)
    return found is not None and found.on_finished is not None


def finished(kind: str, job_id: int, attempt: int, succeeded: bool) -> None:
    """Tell the kind's `on_finished` hook, if any, that a final write landed (the worker calls
    this after the write, never for a rejected one)."""
    found = _handlers.get(kind)
    if found is not None and found.on_finished is not None:
        found.on_finished(job_id, attempt, succeeded)


def handler_leases() -> dict[str, float]:
    """kind -> lease for the handlers that set one (the claim's first lease uses it)."""
    return {h.kind: h.lease_seconds for h in _handlers.values() if h.lease_seconds is not None}


def autodiscover() -> None:
    autodiscover_modules("handlers")
