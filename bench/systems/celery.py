"""Celery 5 + Redis: prefork worker with 2 processes, default prefetch, no result backend.

Two settings of Redis, each labelled:

  celery      the machine's Redis (127.0.0.1:6379, started without persistence: `--save ""
              --appendonly no`): an acknowledged enqueue lives in memory only
  celery_aof  a Redis of its own (127.0.0.1:BENCH_CELERY_AOF_PORT, default 6391, in a temporary
              folder) with `--appendonly yes --appendfsync always`: Redis writes and fsyncs its
              append-only file before it replies, so an acknowledged enqueue is on disk -- what
              Palisade's enqueue promises by PostgreSQL's commit (synchronous_commit on). The
              like-for-like peer of Palisade's single enqueue.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from bench.protocol import spawn
from bench.systems import Context
from bench.systems.agent import AgentSystem


class Celery(AgentSystem):
    key = "celery"
    label = "Celery + Redis (stores nothing durable)"
    venv = "celery"
    agent = "celery_agent.py"

    def worker_cmds(self, ctx: Context) -> list[list[str]]:
        assert self.python is not None
        return [
            [
                str(self.python), "-m", "celery", "-A", "celery_agent", "worker",
                "--concurrency", str(ctx.args.workers), "--pool", "prefork",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "WARNING", "--queues", "bench",
            ]
        ]  # fmt: skip


class CeleryAof(Celery):
    key = "celery_aof"
    label = "Celery + Redis, appendfsync always (durable)"

    def __init__(self) -> None:
        super().__init__()
        self.port = int(os.environ.get("BENCH_CELERY_AOF_PORT", "6391"))

    def env(self, ctx: Context) -> dict[str, str]:
        return {**super().env(ctx), "BENCH_CELERY_REDIS": f"redis://127.0.0.1:{self.port}/0"}

    def setup_peer(self, ctx: Context) -> None:
        """Start this peer's Redis (stopped with the benchmark's other children)."""
        if shutil.which("redis-server") is None:
            raise RuntimeError("celery_aof needs redis-server on PATH")
        folder = tempfile.mkdtemp(prefix="bench-redis-aof-")
        spawn(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", folder,
             "--save", "", "--appendonly", "yes", "--appendfsync", "always"],
            dict(os.environ), ctx.log("celery_aof-redis"),
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            ping = subprocess.run(
                ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
            )
            if ping.stdout.strip() == "PONG":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery_aof: Redis on port {self.port} did not start")
            time.sleep(0.1)
        got = subprocess.run(
            ["redis-cli", "-p", str(self.port), "config", "get", "appendfsync"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        if got[-1:] != ["always"]:  # another Redis already on the port: say so, measure nothing
            raise RuntimeError(f"celery_aof: Redis on port {self.port} is not appendfsync always")
