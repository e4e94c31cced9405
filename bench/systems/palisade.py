"""Palisade itself, its SQL floor and its decomposition rows (run in Palisade's own venv).

palisade  `manage.py qcluster` draining N pre-inserted demo.noop jobs, JOBS_CLAIM_BATCH=64
          (default), behind a start barrier (the queue paused until every drain LISTENs, as
          the Node peers wait for `go`); then idle enqueue -> start samples against the same,
          idle cluster.
batch8    the same drain with JOBS_CLAIM_BATCH=8 (the default until 2026-12-05; like for like
          with graphile-worker's localQueue 8).
batch1    the same drain with JOBS_CLAIM_BATCH=1.
bare      2 raw-psycopg processes: one-statement claim + fenced commit per job, own table.
sql       2 raw-psycopg processes running Palisade's own claim (batch 64; sql8: batch 8) and
          batch commit SQL (jobs.core.sql.PostgresDriver) against jobs_job, autocommit: the SQL
          floor of Palisade.
tasks     the palisade drain of a django.tasks @task no-op through jobs.tasks.PalisadeBackend.
runner    2 plain Django processes calling jobs.worker.runner.drain() in a loop (batch 64): the
runner
          without django-q2 and without the embedded scheduler.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.protocol import (
    ROOT,
    drain_rates,
    group_peak_rss_mb,
    spawn,
    stop,
    summarize,
    wait_for,
)
from bench.systems import Context, recreate_database
from jobs.core.conf import JobsSettings

DB = os.environ.get("BENCH_DB", "palisade_bench")  # one per engineer on a shared server
DEFAULT_BATCH = JobsSettings.CLAIM_BATCH  # JOBS_CLAIM_BATCH's default, 64


class PalisadeDB:
    """The palisade_bench database, Django set up on it in this process (once per run)."""

    ready = False
    conn: psycopg.Connection[Any] | None = None

    @classmethod
    def env(cls, ctx: Context) -> dict[str, str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": ctx.dsn(DB),
            "JOBS_WORKERS": str(ctx.args.workers),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("REDIS_URL", None)  # about the database alone
        return env

    @classmethod
    def setup(cls, ctx: Context) -> None:
        if cls.ready:
            return
        recreate_database(ctx.server, DB)
        out = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT, env=cls.env(ctx), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"migrate failed:\n{out.stdout}\n{out.stderr}")
        cls.conn = psycopg.connect(ctx.dsn(DB), autocommit=True)
        cls.sql(
            """
            CREATE TABLE bench_bare_job (
                id bigserial PRIMARY KEY,
                kind varchar(100) NOT NULL,
                payload jsonb NOT NULL DEFAULT '{}',
                priority smallint NOT NULL DEFAULT 0,
                state varchar(16) NOT NULL DEFAULT 'queued',
                attempt integer NOT NULL DEFAULT 0,
                run_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                lease_expires_at timestamptz,
                claimed_at timestamptz,
                finished_at timestamptz,
                result jsonb
            )
            """
        )
        cls.sql(
            "CREATE INDEX bench_bare_pick_idx ON bench_bare_job (priority DESC, run_at, id) "
            "WHERE state = 'queued'"
        )
        os.environ.update(
            DJANGO_SETTINGS_MODULE="config.settings",
            DATABASE_URL=ctx.dsn(DB),
            JOBS_WORKERS=str(ctx.args.workers),
        )
        os.environ.pop("REDIS_URL", None)
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        import logging

        import django

        django.setup()
        logging.getLogger("django-q").setLevel(logging.WARNING)
        cls.ready = True

    @classmethod
    def sql(cls, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        assert cls.conn is not None
        cur = cls.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    @classmethod
    def one(cls, query: str, params: Any = None) -> tuple[Any, ...]:
        return cls.sql(query, params)[0]

    @classmethod
    def reset(cls) -> None:
        cls.sql(
            "TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, django_q_ormq, django_q_task, "
            "bench_bare_job "
            "RESTART IDENTITY CASCADE"
        )

    @classmethod
    def settle(cls, tables: list[str]) -> None:
        """Same starting conditions for every timed phase: fresh stats, no pending checkpoint."""
        for table in tables:
            cls.sql(f"VACUUM ANALYZE {table}")
        cls.sql("CHECKPOINT")

    @classmethod
    def server_info(cls) -> dict[str, Any]:
        info: dict[str, Any] = {"version": cls.one("SHOW server_version")[0]}
        for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections"):
            info[name] = cls.one(f"SHOW {name}")[0]
        return info

    @classmethod
    def insert_jobs(cls, n: int, kind: str = "demo.noop", payload: Any = None) -> float:
        """N jobs in one bulk_create (Palisade's bulk enqueue); returns seconds."""
        from jobs.models import Job

        cls.reset()
        t0 = time.perf_counter()
        Job.objects.bulk_create([Job(kind=kind, payload=payload or {}) for _ in range(n)])
        took = time.perf_counter() - t0
        cls.settle(["jobs_job", "jobs_attempt", "jobs_jobevent"])
        return took


class Palisade:
    key = "palisade"
    label = f"Palisade, claim batch {DEFAULT_BATCH} (default)"
    batch = DEFAULT_BATCH
    latency = True
    kind = "demo.noop"
    payload: Any = None

    def setup(self, ctx: Context) -> None:
        PalisadeDB.setup(ctx)
        from importlib.metadata import version

        ctx.versions["palisade"] = {d: version(d) for d in ("Django", "django-q2", "psycopg")}

    def enqueue_rates(self, ctx: Context) -> dict[str, float]:
        from jobs import enqueue

        single_n = min(ctx.args.jobs, ctx.args.enqueue_single)
        PalisadeDB.reset()
        t0 = time.perf_counter()
        for _ in range(single_n):
            enqueue("demo.noop", {})  # autocommit: each its own transaction
        single = single_n / (time.perf_counter() - t0)
        bulk = ctx.args.jobs / PalisadeDB.insert_jobs(ctx.args.jobs)
        return {"single_per_s": single, "bulk_per_s": bulk}

    def measure(self, ctx: Context) -> dict[str, Any]:
        n = ctx.args.jobs
        result: dict[str, Any] = {"workers": ctx.args.workers, "claim_batch": self.batch}
        if self.latency:
            result["enqueue"] = self.enqueue_rates(ctx)  # leaves N queued jobs behind
        else:
            PalisadeDB.insert_jobs(n, self.kind, self.payload)
        env = {**PalisadeDB.env(ctx), "JOBS_CLAIM_BATCH": str(self.batch)}
        if ctx.args.q_poll is not None:
            env["Q_POLL"] = str(ctx.args.q_poll)
        log = ctx.log(self.key)
        # The start barrier (as the Node peers have): the queue is paused while the cluster
        # starts, so its processes' start-up (Django imports, forks) is not timed inside the
        # drain; once every worker's drain stands LISTENing, the queue is resumed (the resume
        # NOTIFYs) and the drain runs from its first claim.
        import logging

        from jobs.ops import queues as queue_controls

        logging.getLogger("jobs.queues").setLevel(logging.WARNING)
        queue_controls.pause("default", actor=None)
        proc = spawn([sys.executable, "manage.py", "qcluster"], env, log)
        try:
            self.wait_ready(ctx, proc)
            queue_controls.resume("default", actor=None)

            def drained() -> bool:
                # While jobs are left, two probes of partial indexes (queued, running), each
                # stopping at the first entry: a fraction of a millisecond. Counting jobs_job at
                # every poll (as until 2026-12-05) cost the server 1-3 ms a poll at 4,000 jobs and
                # 10-14 at 30,000, every 20 ms, on the two cores the drain runs on -- a tax on
                # this drain that its SQL floor (timed by its own processes) never paid. The
                # drain's figures come from the rows' own timestamps, so when it is noticed
                # changes nothing else.
                (left,) = PalisadeDB.one(
                    "SELECT (SELECT 1 FROM jobs_job WHERE state = 'queued' "
                    "ORDER BY queue, run_at LIMIT 1) IS NOT NULL "
                    "OR (SELECT 1 FROM jobs_job WHERE state = 'running' "
                    "ORDER BY lease_expires_at LIMIT 1) IS NOT NULL"
                )
                if left:
                    return False
                done, bad = PalisadeDB.one(
                    "SELECT count(*) FILTER (WHERE state = 'succeeded'), "
                    "count(*) FILTER (WHERE state IN ('failed', 'cancelled')) FROM jobs_job"
                )
                if bad:
                    raise RuntimeError(f"{self.key}: {bad} jobs ended badly (see {log})")
                return bool(done >= n)

            # Polled every 20 ms, as the agents' peers are (bench/systems/agent.py).
            wait_for(drained, ctx.args.timeout, self.key, [proc], interval=0.02)
            first_claim, first_finish, last_finish, attempts = PalisadeDB.one(
                "SELECT min(a.claimed_at), min(j.finished_at), max(j.finished_at), count(a.id) "
                "FROM jobs_job j LEFT JOIN jobs_attempt a ON a.job_id = j.id"
            )
            result.update(drain_rates(n, first_claim, first_finish, last_finish))
            result.update(
                attempts=attempts,
                rejected_writes=PalisadeDB.one("SELECT count(*) FROM jobs_rejectedwrite")[0],
                workers_seen=PalisadeDB.one("SELECT count(DISTINCT worker) FROM jobs_attempt")[0],
            )
            if self.latency and ctx.args.latency_samples:
                result["latency"] = self.idle_latency(ctx, proc)
            result["peak_rss"] = group_peak_rss_mb([proc.pid])
        finally:
            stop(proc)
        return result

    def wait_ready(self, ctx: Context, proc: subprocess.Popen[bytes]) -> None:
        """Until the cluster's drains and scheduler (workers + 1) wait for a wake-up -- their
        LISTEN sessions hold WAITER (jobs/core/sql/queues.py) -- then half a second."""
        from jobs.core.sql.queues import WAITER_KEY, WAKE_LOCK_CLASS

        want = ctx.args.workers + 1

        def listening() -> bool:
            (n,) = PalisadeDB.one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                f" AND classid = {WAKE_LOCK_CLASS}::bigint::oid AND objid = {WAITER_KEY}"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            return bool(n >= want)

        wait_for(listening, ctx.args.timeout, f"{self.key} start barrier", [proc])
        time.sleep(0.5)

    def idle_latency(self, ctx: Context, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        """One job at a time into the idle cluster; commit -> claimed_at on the DB clock."""
        from django.db import connection, transaction

        from jobs import enqueue

        time.sleep(1.0)  # let the drains of the throughput phase notice the empty queue
        claim_ms, done_ms = [], []
        for gap in ctx.latency_gaps():
            time.sleep(gap)
            with transaction.atomic():
                job = enqueue("demo.noop", {})
                with connection.cursor() as cur:
                    # the last statement before COMMIT: the row becomes visible right after it
                    cur.execute("SELECT clock_timestamp()")
                    committed_at = cur.fetchone()[0]
            row: tuple[Any, ...] = ()

            def finished(job_id: int = job.pk) -> bool:
                nonlocal row
                row = PalisadeDB.one(
                    "SELECT a.claimed_at, j.finished_at FROM jobs_job j "
                    "LEFT JOIN jobs_attempt a ON a.job_id = j.id AND a.number = 1 "
                    "WHERE j.id = %s",
                    (job_id,),
                )
                return row[1] is not None

            wait_for(finished, 30, "latency", [proc], interval=0.002)
            claim_ms.append((row[0] - committed_at).total_seconds() * 1000)
            done_ms.append((row[1] - committed_at).total_seconds() * 1000)
        return {
            "enqueue_to_start_ms": summarize(claim_ms),
            "enqueue_to_done_ms": summarize(done_ms),
            "raw_ms": [round(x, 2) for x in claim_ms],
        }


class PalisadeEffects(Palisade):
    """The default-batch drain of `demo.staged_effect` jobs: each stages one small output (the local
    filesystem storage) and records one effect under its idempotency key."""

    key = "effects"
    label = "Palisade, stage 1 output + 1 effect"
    latency = False
    kind = "demo.staged_effect"


class PalisadeTasks(Palisade):
    """The default-batch drain of a django.tasks `@task` no-op (demo.tasks.noop) on jobs.tasks'
    backend: the rows `noop.enqueue()` writes, bulk-inserted; each run reads its job and attempts
    for task_started and again for task_finished (sent on a thread of its own)."""

    key = "tasks"
    label = "Palisade via @task (django.tasks)"
    latency = False
    kind = "demo.tasks.noop"
    payload = {"args": [], "kwargs": {}, "backend": "default", "run_after": None}


class PalisadeBatch8(Palisade):
    key = "batch8"
    label = "Palisade, claim batch 8"
    batch = 8
    latency = False


class PalisadeBatch1(Palisade):
    key = "batch1"
    label = "Palisade, claim batch 1"
    batch = 1
    latency = False


# --------------------------------------------------------------------------------------------
# the SQL floor and the decomposition rows: spawned processes racing on one table
# --------------------------------------------------------------------------------------------


def race(target: Any, args: tuple[Any, ...], workers: int, timeout: float) -> list[Any]:
    """Start `workers` spawned processes of `target(*args, ready, go, results)`, release them
    together once all are ready, and return what each reported."""
    mpctx = mp.get_context("spawn")
    ready, go, results = mpctx.Queue(), mpctx.Event(), mpctx.Queue()
    procs = [
        mpctx.Process(target=target, args=(*args, ready, go, results), daemon=True)
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        go.set()
        return [results.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()


class Bare:
    key = "bare"
    label = "bare SQL loop (raw psycopg, own table)"

    def setup(self, ctx: Context) -> None:
        PalisadeDB.setup(ctx)

    def measure(self, ctx: Context) -> dict[str, Any]:
        from bench.systems import palisade_workers

        n = ctx.args.jobs
        PalisadeDB.reset()
        PalisadeDB.sql(
            "INSERT INTO bench_bare_job (kind) SELECT 'demo.noop' FROM generate_series(1, %s)",
            (n,),
        )
        PalisadeDB.settle(["bench_bare_job"])
        counts = race(
            palisade_workers.bare_worker, (ctx.dsn(DB),), ctx.args.workers, ctx.args.timeout
        )
        first, last, first_finish, done = PalisadeDB.one(
            "SELECT min(claimed_at), max(finished_at), min(finished_at), "
            "count(*) FILTER (WHERE state = 'succeeded') FROM bench_bare_job"
        )
        if done != n:
            raise RuntimeError(f"bare loop: {done} of {n} jobs succeeded")
        return {
            "workers": ctx.args.workers,
            **drain_rates(n, first, first_finish, last),
            "per_worker": [c[0] for c in counts],
            "rejected_commits": sum(c[1] for c in counts),
        }


class Decomposition:
    """`sql`, `sql8` or `runner`: N jobs_job rows drained by spawned processes (`batch`)."""

    def __init__(self, key: str, label: str, target: str, batch: int = DEFAULT_BATCH) -> None:
        self.key, self.label, self.target, self.batch = key, label, target, batch

    def setup(self, ctx: Context) -> None:
        PalisadeDB.setup(ctx)

    def measure(self, ctx: Context) -> dict[str, Any]:
        from bench.systems import palisade_workers

        n = ctx.args.jobs
        PalisadeDB.insert_jobs(n)
        target = getattr(palisade_workers, self.target)
        counts = race(target, (ctx.dsn(DB), self.batch), ctx.args.workers, ctx.args.timeout)
        first, last, first_finish, done, attempts = PalisadeDB.one(
            "SELECT min(a.claimed_at), max(j.finished_at), min(j.finished_at), "
            "count(*) FILTER (WHERE j.state = 'succeeded'), count(a.id) "
            "FROM jobs_job j LEFT JOIN jobs_attempt a ON a.job_id = j.id"
        )
        if done != n:
            raise RuntimeError(f"{self.key}: {done} of {n} jobs succeeded")
        return {
            "workers": ctx.args.workers,
            "claim_batch": self.batch,
            **drain_rates(n, first, first_finish, last),
            "attempts": attempts,
            "per_worker": [c[0] for c in counts],
        }
