"""Demo job kinds, so a fresh `bin/run` has something to show."""

import random
import time
from typing import Any

from jobs import handler
from jobs.context import JobContext


@handler("demo.sleep", lease_seconds=15)
def sleep(ctx: JobContext) -> dict[str, Any]:
    """Works for payload['seconds'], checkpointing progress every tenth of the way."""
    seconds = float(ctx.payload.get("seconds", 1.0))
    steps = 10
    for step in range(steps):
        time.sleep(seconds / steps)
        ctx.checkpoint({"done": step + 1, "of": steps})
    return {"slept": seconds, "attempt": ctx.attempt}


@handler("demo.flaky", max_attempts=4)
def flaky(ctx: JobContext) -> dict[str, Any]:
    """Fails with probability payload['fail_rate'] (default one half)."""
    if random.random() < float(ctx.payload.get("fail_rate", 0.5)):
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"ok": True, "attempt": ctx.attempt}


@handler("demo.noop")
def noop(ctx: JobContext) -> None:
    return None
