"""The handler registry: kind -> handler function and its policy.

Owns: `@handler` and lookup. Handlers live in `handlers.py` of any installed app and are imported
by autodiscover() from JobsConfig.ready(), like admin.py. Never: touches the database.
"""

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
KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")


@dataclass(frozen=True)
class Handler:
    kind: str
    fn: HandlerFn
    lease_seconds: float | None = None
    max_attempts: int | None = None
    cron: str | None = None  # a recurring schedule named after the kind (jobs.ops.cron)
    timezone: str = "UTC"
    # Longest one attempt's handler may run before the attempt fails ("exceeded the task
    # timeout of N s") and its worker process is replaced; None: django-q2's Q_TIMEOUT.
    timeout: float | None = None


TIMEOUT_SECONDS = (0.5, 7 * 24 * 3600.0)  # the range of @handler(timeout=...)


_handlers: dict[str, Handler] = {}


def handler(
    kind: str,
    *,
    lease_seconds: float | None = None,
    max_attempts: int | None = None,
    cron: str | None = None,
    timezone: str = "UTC",
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
        _handlers[kind] = Handler(kind, fn, lease, max_attempts, cron, timezone, timeout=limit)
        return fn

    return register


def _check_schedule(cron: object, timezone: object) -> None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from croniter import croniter

    if not isinstance(cron, str) or len(cron) > 200 or not croniter.is_valid(cron):
        raise InvalidOption(f"cron must be a cron expression, not {cron!r}")
    try:
        ZoneInfo(timezone)  # type: ignore[arg-type]
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidOption(f"unknown time zone {timezone!r}") from None


def get_handler(kind: str) -> Handler:
    try:
        return _handlers[kind]
    except KeyError:
        raise UnknownKind(f"no handler is registered for kind {kind!r}") from None


def handler_leases() -> dict[str, float]:
    """kind -> lease for the handlers that set one (the claim's first lease uses it)."""
    return {h.kind: h.lease_seconds for h in _handlers.values() if h.lease_seconds is not None}


def autodiscover() -> None:
    autodiscover_modules("handlers")
