"""Celery 5 + Redis: prefork worker with 2 processes, default prefetch, no result backend."""

from __future__ import annotations

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
