"""Handlers the tests drive. Durations come from the payload so a test decides, per attempt, how
long a handler runs -- no test waits on a fixed sleep of its own."""

import asyncio
import os
import signal
import time
from typing import Any

from jobs import handler
from jobs.context import JobContext


def _duration(ctx: JobContext) -> float:
    by_attempt = ctx.payload.get("seconds_by_attempt", {})
    return float(by_attempt.get(str(ctx.attempt), ctx.payload.get("seconds", 0.0)))


@handler("test.echo")
def echo(ctx: JobContext) -> dict[str, Any]:
    return {"echo": ctx.payload, "attempt": ctx.attempt}


@handler("test.sleep")
def sleep(ctx: JobContext) -> dict[str, Any]:
    """Sleeps without heartbeating itself (the runner's background heartbeat still runs)."""
    time.sleep(_duration(ctx))
    return {"attempt": ctx.attempt, "worker": ctx.worker}


@handler("test.checkpointing")
def checkpointing(ctx: JobContext) -> dict[str, Any]:
    """Works in small steps, checkpointing each; stops only when told or when the lease is lost."""
    deadline = time.monotonic() + _duration(ctx)
    step = 0
    while time.monotonic() < deadline:
        step += 1
        ctx.checkpoint({"step": step})
        time.sleep(0.05)
    return {"attempt": ctx.attempt, "steps": step}


@handler("test.fail", max_attempts=2)
def fail(ctx: JobContext) -> None:
    raise RuntimeError(f"boom on attempt {ctx.attempt}")


@handler("test.long_lease", lease_seconds=600)
def long_lease(ctx: JobContext) -> None:
    return None


class _Scripted(Exception):
    pass


def _base_exception(name: str) -> BaseException:
    from django_q.exceptions import TimeoutException

    return {
        "SystemExit": SystemExit(3),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "CancelledError": asyncio.CancelledError(),
        "TimeoutException": TimeoutException("task exceeded timeout"),
    }[name]


@handler("test.script")
def script(ctx: JobContext) -> Any:
    """Does what the payload says, so one batch can hold well-behaved and hostile jobs:
    `{"return": value}`, `{"raise": text}`, `{"base": "SystemExit"|...}`, `{"kill": true}`,
    `{"seconds": s}` (sleep first), `{"observe": job_id}` (return that job's state now),
    `{"bad": ...}` for values no payload can carry (a NUL or a
    lone surrogate in the result, a NUL in the error text)."""
    p = ctx.payload
    time.sleep(float(p.get("seconds", 0.0)))
    if p.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    bad = p.get("bad")
    if bad == "nul_result":
        return {"text": "before\x00after"}
    if bad == "surrogate_result":
        return {"text": "lone \ud800 surrogate"}
    if bad == "nul_error":
        raise _Scripted("error text with a \x00 NUL")
    if "raise" in p:
        raise _Scripted(p["raise"])
    if "base" in p:
        raise _base_exception(p["base"])
    if "observe" in p:  # what the database says of another job now
        from jobs.models import Job

        return Job.objects.values_list("state", flat=True).get(pk=p["observe"])
    return p.get("return", {"attempt": ctx.attempt})
