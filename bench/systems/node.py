"""The Node peers on PostgreSQL: graphile-worker 0.17 and pg-boss 10, from the npm registry.

Each runs an agent (bench/agents/*_agent.cjs) under the machine's Node, with NODE_PATH at the
cached npm install (bench/peers.py). Their workers wait at a start barrier: each writes that it is
ready (Node, the driver and the pool up), the orchestrator waits for all of them and then writes
`go`, so Node's start-up is not timed. What the peers do not guarantee is in docs/benchmarks.md.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import psycopg

from bench import peers
from bench.systems import Context, recreate_database
from bench.systems.agent import AGENTS, AgentSystem


class NodeSystem(AgentSystem):
    package = ""  # a key of bench.peers.NODE_PINS
    database = ""
    go_table = ""

    def setup(self, ctx: Context) -> None:
        self.modules = peers.node_modules(self.package)
        ctx.versions[self.key] = peers.node_versions(self.package)
        recreate_database(ctx.server, self.database)
        self.agent_cmd(ctx, "setup")

    def env(self, ctx: Context) -> dict[str, str]:
        return {**super().env(ctx), "NODE_PATH": str(self.modules)}

    def agent_cmd(self, ctx: Context, *args: str) -> Any:
        from bench.protocol import run_json

        return run_json(
            ["node", str(AGENTS / self.agent), *args], self.env(ctx),
            timeout=ctx.args.timeout, cwd=AGENTS,
        )  # fmt: skip

    def worker_cmds(self, ctx: Context) -> list[list[str]]:
        return [["node", str(AGENTS / self.agent), "work"] for _ in range(ctx.args.workers)]

    def _sql(self, ctx: Context, *queries: str) -> list[tuple[Any, ...]]:
        """Run each statement on its own (VACUUM cannot share one); the last one's rows."""
        rows: list[tuple[Any, ...]] = []
        with psycopg.connect(ctx.dsn(self.database), autocommit=True) as conn:
            for query in queries:
                cur = conn.execute(query)  # type: ignore[call-overload]
                rows = cur.fetchall() if cur.description else []
        return rows

    def ready(self, ctx: Context) -> int:
        raise NotImplementedError

    def started(self, ctx: Context, procs: list[subprocess.Popen[bytes]]) -> None:
        deadline = time.monotonic() + ctx.args.timeout
        while self.ready(ctx) < len(procs):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{self.key}: a worker exited before the start barrier")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.key}: workers not ready after {ctx.args.timeout} s")
            time.sleep(0.02)
        self._sql(ctx, f"INSERT INTO {self.go_table} VALUES (true)")


class Graphile(NodeSystem):
    """graphile-worker; `settings` are (concurrentJobs, localQueue.size, completion batch delay):
    defaults (1, off, off); like for like with Palisade's claim batch 8 (1, 8, 0); and the
    settings of its performance documentation (24, 500, 0)."""

    package = "graphile-worker"
    agent = "graphile_agent.cjs"
    database = "palisade_bench_graphile"
    go_table = "bench_gw_go"
    completion_is_seen = True  # it deletes the job on completion: the orchestrator sees the end

    def __init__(self, key: str, label: str, concurrency: int, local_queue: int, delay: int):
        super().__init__()
        self.key, self.label = key, label
        self.settings = (concurrency, local_queue, delay)

    def env(self, ctx: Context) -> dict[str, str]:
        concurrency, local_queue, delay = self.settings
        return {
            **super().env(ctx),
            "BENCH_GW_DSN": ctx.dsn(self.database),
            "BENCH_GW_CONCURRENCY": str(concurrency),
            "BENCH_GW_LOCAL_QUEUE": str(local_queue),
            "BENCH_GW_BATCH_DELAY": str(delay),
        }

    def reset(self, ctx: Context) -> None:
        self._sql(
            ctx,
            "TRUNCATE graphile_worker._private_jobs, bench_gw_marks, bench_gw_go, bench_gw_latency",
            "VACUUM ANALYZE graphile_worker._private_jobs",
        )

    def ready(self, ctx: Context) -> int:
        return int(self._sql(ctx, "SELECT count(*) FROM bench_gw_marks")[0][0])

    def status(self, ctx: Context) -> dict[str, Any]:
        n = ctx.args.jobs
        left, bad, first_start, now = self._sql(
            ctx,
            "SELECT count(*), count(*) FILTER (WHERE last_error IS NOT NULL), "
            "(SELECT min(first_start) FROM bench_gw_marks), clock_timestamp() "
            "FROM graphile_worker._private_jobs",
        )[0]
        return {"done": n - left, "bad": bad, "first_start": first_start, "db_now": now}


class PgBoss(NodeSystem):
    key = "pgboss"
    label = "pg-boss 10, batch 100, poll 0.5 s"
    package = "pg-boss"
    agent = "pgboss_agent.cjs"
    database = "palisade_bench_pgboss"
    go_table = "bench_pb_go"

    def env(self, ctx: Context) -> dict[str, str]:
        return {
            **super().env(ctx),
            "BENCH_PB_DSN": ctx.dsn(self.database),
            "BENCH_PB_BATCH": "100",
            "BENCH_PB_POLL": "0.5",
        }

    def reset(self, ctx: Context) -> None:
        self._sql(
            ctx,
            "DELETE FROM pgboss.job WHERE name = 'bench'",
            "TRUNCATE bench_pb_go, bench_pb_ready",
            "VACUUM ANALYZE pgboss.job",
        )

    def ready(self, ctx: Context) -> int:
        return int(self._sql(ctx, "SELECT count(*) FROM bench_pb_ready")[0][0])

    def status(self, ctx: Context) -> dict[str, Any]:
        done, bad, first_start, first_finish, last_finish = self._sql(
            ctx,
            "SELECT count(*) FILTER (WHERE state = 'completed'), "
            "count(*) FILTER (WHERE state = 'failed'), min(started_on), "
            "min(completed_on), max(completed_on) FROM pgboss.job WHERE name = 'bench'",
        )[0]
        return {
            "done": done, "bad": bad, "first_start": first_start,
            "first_finish": first_finish, "last_finish": last_finish,
        }  # fmt: skip


NODE_SYSTEMS: list[NodeSystem] = [
    Graphile("graphile", "graphile-worker 0.17, defaults", 1, 0, -1),
    Graphile(
        "graphile_lq8",
        "graphile-worker, localQueue 8, batched",
        1,
        8,
        0,
    ),  # fmt: skip
    Graphile(
        "graphile_perf",
        "graphile-worker, performance settings",
        24,
        500,
        0,
    ),  # fmt: skip
    PgBoss(),
]
