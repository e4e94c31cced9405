"""The Django-based peers: django-tasks-db (db_worker) and django-q2 (ORM or Redis broker).

They share one venv recipe each and bench/agents/peer_settings.py (standalone settings: nothing
from Palisade). Each has a database of its own.
"""

from __future__ import annotations

from bench.systems import Context, recreate_database
from bench.systems.agent import AgentSystem


class DjangoPeer(AgentSystem):
    agent = "django_agent.py"
    peer = ""
    database = ""

    def env(self, ctx: Context) -> dict[str, str]:
        return {
            **super().env(ctx),
            "BENCH_PEER": self.peer,
            "BENCH_DSN": ctx.dsn(self.database),
            "DJANGO_SETTINGS_MODULE": "peer_settings",
        }

    def setup_peer(self, ctx: Context) -> None:
        recreate_database(ctx.server, self.database)
        self.agent_cmd(ctx, "migrate")


class DjangoTasksDB(DjangoPeer):
    key = "dtdb"
    label = "django-tasks-db (db_worker)"
    venv = "django-tasks-db"
    peer = "dtdb"
    database = "palisade_bench_dtdb"

    def worker_cmds(self, ctx: Context) -> list[list[str]]:
        assert self.python is not None
        # one db_worker per worker process (it runs one task at a time); its idle poll set to
        # Palisade's 50 ms (the default is 1 s)
        return [
            [str(self.python), "-m", "django", "db_worker", "--interval", "0.05",
             "--no-startup-delay", "--no-reload", "--worker-id", f"bench{i}"]
            for i in range(ctx.args.workers)
        ]  # fmt: skip


class DjangoQ2(DjangoPeer):
    venv = "django-q2-redis"
    # django-q2 saves the success row after the worker's `stopped` (its monitor is the slow
    # stage): completion is the moment the N-th row is seen, on the database clock
    completion_is_seen = True
    # and it records no start (`started` is the enqueue time): the first task's `stopped` is
    # the start marker, so the rate counts N-1 jobs
    first_marker_is_finish = True

    def worker_cmds(self, ctx: Context) -> list[list[str]]:
        assert self.python is not None
        return [[str(self.python), "-m", "django", "qcluster"]]


class DjangoQ2Orm(DjangoQ2):
    key = "djq_orm"
    label = "django-q2, ORM broker"
    peer = "djq-orm"
    database = "palisade_bench_djq_orm"


class DjangoQ2Redis(DjangoQ2):
    key = "djq_redis"
    label = "django-q2, Redis broker"
    peer = "djq-redis"
    database = "palisade_bench_djq_redis"
