"""Demo job kinds, so a fresh `bin/run` has something to show, and the drill's slow job."""

import random
import time
from typing import Any

from jobs import handler
from jobs.context import JobContext

DRILL_KIND = "demo.drill"
DRILL_LEASE_SECONDS = 2.0


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


@handler(DRILL_KIND, lease_seconds=DRILL_LEASE_SECONDS, max_attempts=5)
def drill(ctx: JobContext) -> dict[str, Any]:
    """The drill's slow job: one plain sleep (no checkpoints), so a SIGSTOP lands inside it and
    the resumed process goes straight to its commit -- the stale write the fence rejects."""
    time.sleep(float(ctx.payload.get("seconds", 3.0)))
    return {"attempt": ctx.attempt, "worker": ctx.worker}


@handler("demo.work")
def work(ctx: JobContext) -> None:
    """Stands in for real work: one plain sleep of payload['ms'] milliseconds (bench/mixed.py)."""
    time.sleep(max(0.0, min(float(ctx.payload.get("ms", 1.0)), 60_000.0)) / 1000.0)
