"""Handlers the tests drive. Durations come from the payload so a test decides, per attempt, how
long a handler runs -- no test waits on a fixed sleep of its own."""

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
