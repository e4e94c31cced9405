"""The handler registry: kind -> handler function and its policy.

Owns: `@handler` and lookup. Handlers live in `handlers.py` of any installed app and are imported
by autodiscover() from JobsConfig.ready(), like admin.py. Never: touches the database.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import autodiscover_modules

from jobs.exceptions import HandlerAlreadyRegistered, UnknownKind

if TYPE_CHECKING:
    from jobs.context import JobContext

HandlerFn = Callable[["JobContext"], Any]


@dataclass(frozen=True)
class Handler:
    kind: str
    fn: HandlerFn
    lease_seconds: float | None = None
    max_attempts: int | None = None


_handlers: dict[str, Handler] = {}


def handler(
    kind: str, *, lease_seconds: float | None = None, max_attempts: int | None = None
) -> Callable[[HandlerFn], HandlerFn]:
    """Register `fn(ctx) -> JSON-able result` as the handler for `kind`."""
    if not kind or not isinstance(kind, str) or len(kind) > 100:
        raise ValueError("a handler kind is a non-empty string of at most 100 characters")
    if lease_seconds is not None and lease_seconds <= 0:
        raise ValueError("lease_seconds must be positive")
    if max_attempts is not None and max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")

    def register(fn: HandlerFn) -> HandlerFn:
        existing = _handlers.get(kind)
        if existing is not None and existing.fn is not fn:
            qualname = f"{existing.fn.__module__}.{existing.fn.__qualname__}"
            raise HandlerAlreadyRegistered(f"kind {kind!r} is already handled by {qualname}")
        _handlers[kind] = Handler(kind, fn, lease_seconds, max_attempts)
        return fn

    return register


def get_handler(kind: str) -> Handler:
    try:
        return _handlers[kind]
    except KeyError:
        raise UnknownKind(f"no handler is registered for kind {kind!r}") from None


def autodiscover() -> None:
    autodiscover_modules("handlers")
