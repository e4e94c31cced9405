"""procrastinate 3 on PostgreSQL: 2 worker processes (concurrency 1 each), LISTEN/NOTIFY on."""

from __future__ import annotations

from typing import Any

import psycopg

from bench.systems import Context, recreate_database
from bench.systems.agent import AgentSystem

DB = "palisade_bench_procrastinate"


class Procrastinate(AgentSystem):
    key = "procrastinate"
    label = "procrastinate (PostgreSQL)"
    venv = "procrastinate"
    agent = "procrastinate_agent.py"

    def env(self, ctx: Context) -> dict[str, str]:
        return {**super().env(ctx), "BENCH_PROCRASTINATE_DSN": ctx.dsn(DB)}

    def setup_peer(self, ctx: Context) -> None:
        assert self.python is not None
        import subprocess

        recreate_database(ctx.server, DB)
        subprocess.run(
            [str(self.python), "-m", "procrastinate", "--app=procrastinate_agent.app",
             "schema", "--apply"],
            env=self.env(ctx), cwd=str(self._agents()), check=True, capture_output=True,
        )  # fmt: skip

    def _agents(self) -> Any:
        from bench.systems.agent import AGENTS

        return AGENTS

    def worker_cmds(self, ctx: Context) -> list[list[str]]:
        assert self.python is not None
        return [
            [str(self.python), "-m", "procrastinate", "--app=procrastinate_agent.app",
             "worker", "--concurrency", "1", "--queues", "bench", "--delete-jobs", "never"]
            for _ in range(ctx.args.workers)
        ]  # fmt: skip

    def reset(self, ctx: Context) -> None:
        with psycopg.connect(ctx.dsn(DB), autocommit=True) as conn:
            conn.execute("TRUNCATE procrastinate_jobs RESTART IDENTITY CASCADE")
            conn.execute("VACUUM ANALYZE procrastinate_jobs")

    def status(self, ctx: Context) -> dict[str, Any]:
        with psycopg.connect(ctx.dsn(DB), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE type = 'succeeded'), "
                "count(*) FILTER (WHERE type = 'failed'), "
                "min(at) FILTER (WHERE type = 'started'), "
                "min(at) FILTER (WHERE type = 'succeeded'), "
                "max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
            ).fetchone()
        assert row is not None
        return {
            "done": row[0],
            "bad": row[1],
            "first_start": row[2],
            "first_finish": row[3],
            "last_finish": row[4],
        }
