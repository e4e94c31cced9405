"""A peer measured through an agent script running inside the peer's own venv."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import peers
from bench.protocol import (
    BENCH_DIR,
    drain_rates,
    group_peak_rss_mb,
    run_json,
    spawn,
    stop,
    summarize,
    wait_for,
)
from bench.systems import Context

AGENTS = BENCH_DIR / "agents"


class AgentSystem:
    key = ""
    label = ""
    venv = ""  # a key of bench.peers.PINS
    agent = ""  # file under bench/agents/

    def __init__(self) -> None:
        self.python: Path | None = None

    # -- what a peer defines ---------------------------------------------------------------------

    def env(self, ctx: Context) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "PYTHONPATH": str(AGENTS),
            "PYTHONUNBUFFERED": "1",
            "BENCH_WORKERS": str(ctx.args.workers),
        }

    def worker_cmds(self, ctx: Context) -> list[list[str]]:
        raise NotImplementedError

    def setup_peer(self, ctx: Context) -> None:
        """Create the peer's database/schema (once per run)."""

    def status(self, ctx: Context) -> dict[str, Any]:
        """done, bad, first_start, first_finish, last_finish (epoch seconds or datetimes)."""
        return self.agent_cmd(ctx, "status")

    def reset(self, ctx: Context) -> None:
        self.agent_cmd(ctx, "reset")

    def started(self, ctx: Context, procs: list[subprocess.Popen[bytes]]) -> None:
        """Called once the workers are spawned, before the drain is timed (a start barrier)."""

    # -- the protocol ----------------------------------------------------------------------------

    def agent_cmd(self, ctx: Context, *args: str) -> Any:
        assert self.python is not None
        return run_json(
            [str(self.python), str(AGENTS / self.agent), *args],
            self.env(ctx),
            timeout=ctx.args.timeout,
            cwd=AGENTS,
        )

    def setup(self, ctx: Context) -> None:
        self.python = peers.venv_python(self.venv)
        ctx.versions[self.key] = peers.versions(self.venv)
        self.setup_peer(ctx)

    def measure(self, ctx: Context) -> dict[str, Any]:
        n = ctx.args.jobs
        single_n = min(n, ctx.args.enqueue_single)
        self.reset(ctx)
        single = self.agent_cmd(ctx, "enqueue", str(single_n))
        self.reset(ctx)
        bulk = self.agent_cmd(ctx, "enqueue-bulk", str(n))
        result: dict[str, Any] = {
            "workers": ctx.args.workers,
            "enqueue": {
                "single_per_s": single["n"] / single["seconds"],
                "bulk_per_s": bulk["n"] / bulk["seconds"],
            },
        }
        procs = [
            spawn(cmd, self.env(ctx), ctx.log(f"{self.key}-w{i}"), cwd=AGENTS)
            for i, cmd in enumerate(self.worker_cmds(ctx))
        ]
        try:
            self.started(ctx, procs)
            last: dict[str, Any] = {}

            def drained() -> bool:
                nonlocal last
                last = self.status(ctx)
                if last.get("bad"):
                    raise RuntimeError(f"{self.key}: {last['bad']} jobs failed")
                return last["done"] >= n

            wait_for(drained, ctx.args.timeout, self.key, procs, interval=0.02)
            finish = last.get("last_finish") or last.get("db_now")
            seen = last.get("db_now")
            if self.completion_is_seen and seen is not None:
                finish = seen  # the durable row is written after the worker's `stopped`
            counted = n - 1 if self.first_marker_is_finish else n
            result.update(
                drain_rates(
                    counted, last["first_start"], last.get("first_finish") or finish, finish
                )
            )
            if ctx.args.latency_samples:
                time.sleep(0.5)  # let the workers go idle
                lat = self.agent_cmd(ctx, "latency", json.dumps(ctx.latency_gaps()))
                samples = lat["enqueue_to_start_ms"]
                result["latency"] = {
                    "enqueue_to_start_ms": summarize(samples),
                    "raw_ms": [round(x, 2) for x in samples],
                }
            result["peak_rss"] = group_peak_rss_mb([p.pid for p in procs])
        finally:
            for p in procs:
                stop(p)
        return result

    completion_is_seen = False
    first_marker_is_finish = False


def psql(dsn: str, query: str) -> None:
    subprocess.run(["psql", dsn, "-q", "-c", query], check=True, capture_output=True)
