"""The outbox's targets: what the relay calls for an intent, registered by name.

Owns: the registry (`register_target`, `get_target`; the built-in `webhook`,
jobs/effects/webhook.py, registered here), how a target's methods are called -- with the relay's
token where they take one -- and what one raised, as text (`said`). A BaseException from a target
that is not a stop (SystemExit from a library's sys.exit(), asyncio.CancelledError, a library's
own) comes out of `call` as `TargetExited`, an ordinary exception: that call's failure, recorded
on its own intent like any other, never the end of the relay's thread or batch. KeyboardInterrupt
and GeneratorExit pass through. Never: claims, marks or decides anything about an intent
(jobs/effects/outbox.py does). Hazards: a target is registered at import of a handlers module, so
every process that runs the relay must import the same modules.
"""

import inspect
import re
from typing import Any, Protocol

from jobs.core.exceptions import InvalidOption
from jobs.effects.webhook import WebhookTarget


class Target(Protocol):
    """What the relay calls: `perform(key, data, token)`; `token` is the relay's fencing token
    (a target whose `perform` takes only `(key, data)` is called without it). Return None (or
    True) once performed. Raise `Refused` when the call was certainly not performed (retried with
    backoff); any other exception (a timeout, `OutcomeUnknown`; SystemExit or another
    BaseException but KeyboardInterrupt and GeneratorExit too) means it may have happened:
    reconciled, never re-sent blind. So does returning anything else (False, an HTTP client's
    response to a 500): it says neither "performed" nor which failure; the row names the contract.

    A target may also offer `reconcile(key, data, token) -> bool | None`: True, the effect
    happened; False, it did not (and a lower token never will); None, no way to tell (the intent
    is parked for an operator). Raising, or answering anything else (0, a falsy HTTP response),
    means "cannot tell yet": asked again later. And
    `validate(data)`, called by `ctx.intent()` on the data as stored: raise `InvalidOption` for
    data it can never perform (the handler's error at once)."""

    def perform(self, key: str, data: Any) -> None: ...


class TargetExited(Exception):
    """A target's method raised a BaseException that is not a stop (`raised`): carried as an
    ordinary exception, so it fails that call alone (outbox.py: an unknown outcome)."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(raised)
        self.raised = raised


STOPS = (KeyboardInterrupt, GeneratorExit)  # a stop of this process or generator: never caught

_targets: dict[str, Target] = {}
_takes_token: dict[tuple[str, str], bool] = {}


def _accepts_token(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "token" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def register_target(name: str, target: Target) -> None:
    """Register an outbox target by name (at import of a handlers module, in every process)."""
    if not re.fullmatch(r"[a-z][a-z0-9._-]{0,99}", name):
        raise InvalidOption(f"target name {name!r} must be lowercase letters, digits, . _ -")
    _targets[name] = target
    for method in ("perform", "reconcile"):
        _takes_token[name, method] = _accepts_token(getattr(target, method, None))


def get_target(name: str) -> Target | None:
    return _targets.get(name)


def call(name: str, target: Any, method: str, key: str, data: Any, token: int) -> Any:
    """`target.method(key, data, token=token)` for the target registered as `name`; the token
    is passed only to a method that takes one."""
    fn = getattr(target, method)
    try:
        if _takes_token.get((name, method)):
            return fn(key, data, token=token)
        return fn(key, data)
    except (Exception, *STOPS):
        raise
    except BaseException as exc:  # noqa: BLE001  SystemExit and the like: this call's failure
        raise TargetExited(exc) from exc


def said(exc: BaseException) -> str:
    """What a target raised, as its try's error: `Class: message` (a `TargetExited`: the class
    and message of what it carries). Never raises: an API error's own __str__ may (a field it
    lacks); then `Class: (its message cannot be read: KeyError)`."""
    if isinstance(exc, TargetExited):
        exc = exc.raised
    try:
        message = str(exc)
    except Exception as failed:  # noqa: BLE001  the exception's own code
        message = f"(its message cannot be read: {type(failed).__name__})"
    return f"{type(exc).__name__}: {message}"


register_target("webhook", WebhookTarget())
