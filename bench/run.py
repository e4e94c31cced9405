#!/usr/bin/env python
"""Palisade throughput/latency benchmark with its peers, on PostgreSQL, in one run.

    .venv/bin/python bench/run.py [--jobs 4000] [--workers 2] [--repeat 1]

Scenarios (each repeat runs all of them, interleaved, against one database server):

  bare      2 raw-psycopg processes: one-statement claim + fenced commit per job, own table.
  palisade  `manage.py qcluster` draining N pre-inserted demo.noop jobs, JOBS_CLAIM_BATCH=8
            (default), then idle enqueue->claim latency samples against the same, idle cluster.
  batch1    the same drain with JOBS_CLAIM_BATCH=1.
  effects   the palisade drain (batch 8) of demo.staged_effect jobs: each stages one small
            output (local filesystem storage) and records one effect under its idempotency key.
  djq       django-q2 alone (ORM broker, stock qcluster): one async_task("math.floor", 1) per job.

Decomposition rows (where Palisade's time goes between the bare loop and the cluster):

  sql       2 raw-psycopg processes running Palisade's own claim (batch 8) and batch commit
            SQL (jobs.sql.PostgresDriver) against jobs_job, autocommit: the SQL floor of Palisade.
  runner    2 plain Django processes calling jobs.runner.drain() in a loop (batch 8): the
            Palisade runner without django-q2 and without the embedded scheduler.

The database `palisade_bench` is dropped and recreated, then migrated. See bench/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432"
DB_NAME = os.environ.get("BENCH_DB", "palisade_bench")  # one per engineer on a shared server
BENCH_SECRET_KEY = os.environ.get("SECRET_KEY", "palisade-bench-only")  # DEBUG is off
SCENARIOS = ("bare", "sql", "runner", "palisade", "effects", "batch1", "djq")


def drain_rates(n: int, first_claim: Any, first_finish: Any, last_finish: Any) -> dict[str, Any]:
    """Throughput on the database clock: N over first claim -> last finish, and the steady
    rate between the first and the last finish (excludes the first claim's start-up)."""
    span = (last_finish - first_claim).total_seconds()
    return {
        "jobs": n,
        "span_s": span,
        "jobs_per_s": n / span,
        "steady_jobs_per_s": (n - 1) / (last_finish - first_finish).total_seconds(),
    }


# --------------------------------------------------------------------------------------------
# child processes: always in their own process group, always stopped on the way out
# --------------------------------------------------------------------------------------------

_CHILDREN: list[subprocess.Popen[bytes]] = []


def spawn(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log = open(log_path, "ab")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    _CHILDREN.append(proc)
    return proc


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the leader (django-q2 stops its cluster), then the group, then SIGKILL the group."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    if _group_alive(pgid):
        _killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if _group_alive(pgid):
        _killpg(pgid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


def stop_all() -> None:
    for proc in list(_CHILDREN):
        stop(proc, grace=5.0)


def _on_signal(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# --------------------------------------------------------------------------------------------
# database plumbing
# --------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = args.server.rstrip("/")
        self.db_url = f"{self.server}/{DB_NAME}"
        self.log_dir = RESULTS_DIR / "logs"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": self.db_url,
            "SECRET_KEY": BENCH_SECRET_KEY,
            "JOBS_WORKERS": str(args.workers),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("REDIS_URL", None)  # the benchmark is about the database alone
        self.conn: psycopg.Connection[Any] | None = None
        self.rep = 1

    # -- setup ---------------------------------------------------------------------------------

    def create_database(self) -> None:
        with psycopg.connect(f"{self.server}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {DB_NAME}")
        out = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if out.returncode != 0:
            raise RuntimeError(f"migrate failed:\n{out.stdout}\n{out.stderr}")
        self.conn = psycopg.connect(self.db_url, autocommit=True)
        self.sql(
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
        self.sql(
            "CREATE INDEX bench_bare_pick_idx ON bench_bare_job (priority DESC, run_at, id) "
            "WHERE state = 'queued'"
        )

    def setup_django(self) -> None:
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        os.environ["DATABASE_URL"] = self.db_url
        os.environ.setdefault("SECRET_KEY", BENCH_SECRET_KEY)
        os.environ["JOBS_WORKERS"] = str(self.args.workers)
        os.environ.pop("REDIS_URL", None)
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        import logging

        import django

        django.setup()
        logging.getLogger("django-q").setLevel(logging.WARNING)  # async_task logs every enqueue

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        assert self.conn is not None
        cur = self.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def one(self, query: str, params: Any = None) -> tuple[Any, ...]:
        return self.sql(query, params)[0]

    def reset(self) -> None:
        self.sql(
            "TRUNCATE jobs_job, django_q_ormq, django_q_task, bench_bare_job "
            "RESTART IDENTITY CASCADE"
        )

    def settle(self, tables: list[str]) -> None:
        """Same starting conditions for every timed phase: fresh stats, no pending checkpoint."""
        for table in tables:
            self.sql(f"VACUUM ANALYZE {table}")
        self.sql("CHECKPOINT")

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"version": self.one("SHOW server_version")[0]}
        for name in ("synchronous_commit", "fsync", "shared_buffers", "max_connections"):
            info[name] = self.one(f"SHOW {name}")[0]
        info["other_active_backends"] = self.one(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND pid <> pg_backend_pid()"
        )[0]
        return info

    # -- scenario: bare SQL loop -------------------------------------------------------------------

    def run_bare(self) -> dict[str, Any]:
        n, workers = self.args.jobs, self.args.workers
        self.reset()
        self.sql(
            "INSERT INTO bench_bare_job (kind) SELECT 'demo.noop' FROM generate_series(1, %s)",
            (n,),
        )
        self.settle(["bench_bare_job"])
        counts, wall = self.race(bare_worker, (self.db_url,), workers)
        first_claim, last_finish, first_finish, done = self.one(
            "SELECT min(claimed_at), max(finished_at), min(finished_at), "
            "count(*) FILTER (WHERE state = 'succeeded') FROM bench_bare_job"
        )
        if done != n:
            raise RuntimeError(f"bare loop: {done} of {n} jobs succeeded")
        return {
            "workers": workers,
            **drain_rates(n, first_claim, first_finish, last_finish),
            "wall_s": wall,
            "per_worker": [c[0] for c in counts],
            "rejected_commits": sum(c[1] for c in counts),
            "cpu_s_per_worker": [round(c[2], 3) for c in counts],
        }

    # -- scenario: Palisade drain (+ idle latency) -------------------------------------------------

    def run_palisade(
        self, batch: int, latency: bool, label: str, kind: str = "demo.noop"
    ) -> dict[str, Any]:
        from jobs.models import Job

        n = self.args.jobs
        self.reset()
        Job.objects.bulk_create([Job(kind=kind, payload={}) for _ in range(n)], batch_size=1000)
        self.settle(
            [
                "jobs_job",
                "jobs_attempt",
                "jobs_jobevent",
                "jobs_stagedoutput",
                "jobs_idempotencykey",
            ]
        )
        media = RESULTS_DIR / "media"
        shutil.rmtree(media, ignore_errors=True)  # the staged outputs of an earlier round
        env = {**self.env, "JOBS_CLAIM_BATCH": str(batch), "MEDIA_ROOT": str(media)}
        if self.args.q_poll is not None:
            env["Q_POLL"] = str(self.args.q_poll)
        log = self.log_dir / f"{label}-{self.rep}.log"
        log.write_text("")
        t_spawn = time.monotonic()
        proc = spawn([sys.executable, "manage.py", "qcluster"], env, log)
        result: dict[str, Any] = {"jobs": n, "workers": self.args.workers, "claim_batch": batch}
        try:
            t_done, _ = self._wait(
                proc,
                "SELECT count(*) FILTER (WHERE state = 'succeeded'), "
                "count(*) FILTER (WHERE state IN ('failed', 'cancelled')), clock_timestamp() "
                "FROM jobs_job",
                n,
                label,
                log,
            )
            first_claim, last_finish, first_finish, attempts = self.one(
                "SELECT min(a.claimed_at), max(j.finished_at), min(j.finished_at), count(a.id) "
                "FROM jobs_job j LEFT JOIN jobs_attempt a ON a.job_id = j.id"
            )
            span = (last_finish - first_claim).total_seconds()
            result.update(
                span_s=span,
                jobs_per_s=n / span,
                steady_jobs_per_s=(n - 1) / (last_finish - first_finish).total_seconds(),
                wall_from_spawn_s=t_done - t_spawn,
                attempts=attempts,
                rejected_writes=self.one("SELECT count(*) FROM jobs_rejectedwrite")[0],
                workers_seen=self.one("SELECT count(DISTINCT worker) FROM jobs_attempt")[0],
                drain_tasks_saved=self.one("SELECT count(*) FROM django_q_task")[0],
            )
            if latency:
                result["latency"] = self._latency(proc, log)
        finally:
            stop(proc)
        return result

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        count_sql: str,
        n: int,
        label: str,
        log: Path,
    ) -> tuple[float, Any]:
        """Poll until `count_sql` (done, bad, clock_timestamp()) reports n done; fail fast on a
        dead cluster or bad jobs. Returns the monotonic time and the database clock then."""
        deadline = time.monotonic() + self.args.timeout
        while True:
            done, bad, db_now = self.one(count_sql)
            if done >= n:
                return time.monotonic(), db_now
            if bad:
                raise RuntimeError(f"{label}: {bad} jobs ended badly (see {log})")
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: qcluster exited with {proc.returncode} (see {log})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: {done}/{n} done after {self.args.timeout}s")
            time.sleep(0.01)

    def _latency(self, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
        """Enqueue one job at a time into the idle cluster; commit -> claimed_at on the DB clock."""
        from django.db import connection, transaction

        from jobs import enqueue

        rng = random.Random(self.args.seed)
        time.sleep(1.0)  # let the drains of the throughput phase notice the empty queue
        claim_ms, done_ms = [], []
        for i in range(self.args.latency_samples):
            time.sleep(rng.uniform(self.args.gap_min, self.args.gap_max))
            with transaction.atomic():
                job = enqueue("demo.noop", {"sample": i})
                with connection.cursor() as cur:
                    # the last statement before COMMIT: the row becomes visible right after this
                    cur.execute("SELECT clock_timestamp()")
                    committed_at = cur.fetchone()[0]
            deadline = time.monotonic() + 30.0
            while True:
                row = self.sql(
                    "SELECT a.claimed_at, j.finished_at FROM jobs_job j "
                    "LEFT JOIN jobs_attempt a ON a.job_id = j.id AND a.number = 1 "
                    "WHERE j.id = %s",
                    (job.pk,),
                )[0]
                if row[1] is not None:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"latency: qcluster exited (see {log})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"latency: job {job.pk} not done after 30 s")
                time.sleep(0.005)
            claim_ms.append((row[0] - committed_at).total_seconds() * 1000)
            done_ms.append((row[1] - committed_at).total_seconds() * 1000)
        return {
            "samples": len(claim_ms),
            "enqueue_to_claim_ms": summarize(claim_ms),
            "enqueue_to_done_ms": summarize(done_ms),
            "raw_claim_ms": [round(x, 2) for x in claim_ms],
        }

    # -- decomposition: Palisade's SQL in a raw loop, and the runner without django-q2 -------------

    def _insert_jobs(self) -> None:
        from jobs.models import Job

        self.reset()
        Job.objects.bulk_create(
            [Job(kind="demo.noop", payload={}) for _ in range(self.args.jobs)], batch_size=1000
        )
        self.settle(["jobs_job", "jobs_attempt", "jobs_jobevent"])

    def race(self, target: Any, args: tuple[Any, ...], workers: int) -> tuple[list[Any], float]:
        """Start `workers` spawned processes of `target(*args, ready, go, results)`, release them
        together once all are ready, and return their results and the wall time."""
        ctx = mp.get_context("spawn")
        ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(target=target, args=(*args, ready, go, results), daemon=True)
            for _ in range(workers)
        ]
        for p in procs:
            p.start()
        try:
            for _ in procs:
                ready.get(timeout=120)
            t0 = time.monotonic()
            go.set()
            counts = [results.get(timeout=self.args.timeout) for _ in procs]
            return counts, time.monotonic() - t0
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
                if p.is_alive():
                    p.kill()

    def run_workers(self, target: Any, label: str, batch: int = 8) -> dict[str, Any]:
        """Run `target(dsn, batch, ready, go, results)` in N spawned processes on jobs_job."""
        n, workers = self.args.jobs, self.args.workers
        self._insert_jobs()
        counts, wall = self.race(target, (self.db_url, batch), workers)
        first_claim, last_finish, first_finish, done, attempts = self.one(
            "SELECT min(a.claimed_at), max(j.finished_at), min(j.finished_at), "
            "count(*) FILTER (WHERE j.state = 'succeeded'), count(a.id) "
            "FROM jobs_job j LEFT JOIN jobs_attempt a ON a.job_id = j.id"
        )
        if done != n:
            raise RuntimeError(f"{label}: {done} of {n} jobs succeeded")
        return {
            "workers": workers,
            "claim_batch": batch,
            **drain_rates(n, first_claim, first_finish, last_finish),
            "wall_s": wall,
            "attempts": attempts,
            "per_worker": [c[0] for c in counts],
            "cpu_s_per_worker": [round(c[1], 3) for c in counts],
        }

    # -- scenario: django-q2 alone -----------------------------------------------------------------

    def run_djq(self) -> dict[str, Any]:
        from django.db import transaction
        from django_q.brokers import get_broker
        from django_q.tasks import async_task

        n = self.args.jobs
        self.reset()
        broker = get_broker()
        with transaction.atomic():
            for _ in range(n):
                async_task("math.floor", 1, broker=broker)
        queued = self.one("SELECT count(*) FROM django_q_ormq")[0]
        if queued != n:
            raise RuntimeError(f"djq: {queued} of {n} tasks queued")
        self.settle(["django_q_ormq", "django_q_task"])
        env = {**self.env, "DJANGO_SETTINGS_MODULE": "bench.djq_settings"}
        log = self.log_dir / f"djq-{self.rep}.log"
        log.write_text("")
        t_spawn = time.monotonic()
        proc = spawn([sys.executable, "manage.py", "qcluster"], env, log)
        try:
            t_done, db_now = self._wait(
                proc,
                "SELECT count(*) FILTER (WHERE success), count(*) FILTER (WHERE NOT success), "
                "clock_timestamp() FROM django_q_task",
                n,
                "djq",
                log,
            )
            deadline = time.monotonic() + self.args.timeout
            first_stop, last_stop = self.one("SELECT min(stopped), max(stopped) FROM django_q_task")
            # ack (OrmQ delete) follows the result save; wait for it so nothing is left behind
            while self.one("SELECT count(*) FROM django_q_ormq")[0] and time.monotonic() < deadline:
                time.sleep(0.01)
            span = (db_now - first_stop).total_seconds()
            return {
                "jobs": n,
                "workers": self.args.workers,
                # first task finished (worker clock) -> last result row observed (DB clock)
                "span_s": span,
                "jobs_per_s": (n - 1) / span,
                "worker_span_s": (last_stop - first_stop).total_seconds(),
                "wall_from_spawn_s": t_done - t_spawn,
                "ormq_left": self.one("SELECT count(*) FROM django_q_ormq")[0],
            }
        finally:
            stop(proc)


# --------------------------------------------------------------------------------------------
# the bare loop's worker (a spawned process; imports nothing from the project)
# --------------------------------------------------------------------------------------------

BARE_CLAIM = """
UPDATE bench_bare_job
   SET state = 'running', attempt = attempt + 1,
       lease_expires_at = clock_timestamp() + interval '30 seconds',
       claimed_at = clock_timestamp()
 WHERE id = (SELECT id FROM bench_bare_job
              WHERE state = 'queued' AND run_at <= clock_timestamp()
              ORDER BY priority DESC, run_at, id
              LIMIT 1
                FOR UPDATE SKIP LOCKED)
RETURNING id, attempt, kind, payload
"""

BARE_COMMIT = """
UPDATE bench_bare_job
   SET state = 'succeeded', result = 'null'::jsonb, lease_expires_at = NULL,
       finished_at = clock_timestamp()
 WHERE id = %s AND attempt = %s AND state = 'running'
"""


def bare_worker(dsn: str, ready: Any, go: Any, results: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ready.put(os.getpid())
        go.wait()
        cpu0 = time.process_time()
        done = rejected = 0
        while True:
            row = conn.execute(BARE_CLAIM).fetchone()
            if row is None:
                break
            if conn.execute(BARE_COMMIT, (row[0], row[1])).rowcount != 1:
                rejected += 1
            done += 1
    results.put((done, rejected, time.process_time() - cpu0))


def _child_django(batch: int) -> None:
    os.environ["JOBS_CLAIM_BATCH"] = str(batch)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def sql_worker(dsn: str, batch: int, ready: Any, go: Any, results: Any) -> None:
    """Palisade's claim and batch-commit statements (jobs.sql) on a raw autocommit connection."""
    _child_django(batch)
    from jobs.sql import CommitRow, PostgresDriver

    driver = PostgresDriver()
    worker = f"bench-sql:{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        ready.put(os.getpid())
        go.wait()
        cpu0 = time.process_time()
        done = 0
        while rows := driver.claim(cur, worker, batch, 30.0, None, {}):
            committed = driver.commit(
                cur, worker, [CommitRow(r.id, r.attempt, None, "") for r in rows]
            )
            if len(committed) != len(rows):
                raise RuntimeError("a fenced commit was rejected in an uncontended loop")
            done += len(rows)
    results.put((done, time.process_time() - cpu0))


def runner_worker(dsn: str, batch: int, ready: Any, go: Any, results: Any) -> None:
    """jobs.runner.drain() in a plain Django process: no django-q2, no embedded scheduler."""
    _child_django(batch)
    from django.db import connection

    from jobs import runner

    connection.ensure_connection()
    ready.put(os.getpid())
    go.wait()
    cpu0 = time.process_time()
    done = 0
    while True:
        ran = runner.drain()
        if not ran:
            break
        done += ran
    results.put((done, time.process_time() - cpu0))
    connection.close()


# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 0.50), 2),
        "p95": round(percentile(values, 0.95), 2),
        "max": round(max(values), 2),
        "min": round(min(values), 2),
        "mean": round(statistics.fmean(values), 2),
    }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


ROWS = [
    ("palisade", "Palisade drain, claim batch 8"),
    ("effects", "Palisade drain, stage 1 output + 1 effect"),
    ("batch1", "Palisade drain, claim batch 1"),
    ("bare", "bare SQL loop (raw psycopg)"),
    ("djq", "django-q2 alone, ORM broker"),
    ("sql", "  decomposition: Palisade SQL, raw loop, b8"),
    ("runner", "  decomposition: runner.drain(), no django-q2"),
]


def build_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for key, _ in ROWS:
        rates = [r[key]["jobs_per_s"] for r in runs if key in r]
        if rates:
            summary[key] = {"jobs_per_s_median": median(rates), "jobs_per_s_all": rates}
    lat = [r["palisade"]["latency"] for r in runs if "latency" in r.get("palisade", {})]
    if lat:
        claims = [x for sample in lat for x in sample["raw_claim_ms"]]
        summary["latency_enqueue_to_claim_ms"] = summarize(claims)
        summary["latency_enqueue_to_claim_ms"]["samples"] = len(claims)
    return summary


def print_table(summary: dict[str, Any], args: argparse.Namespace) -> None:
    base = summary.get("palisade", {}).get("jobs_per_s_median")
    print()
    print(f"N = {args.jobs} no-op jobs, {args.workers} workers, repeat = {args.repeat} (median)")
    print(f"{'name':<44} {'jobs/s':>10} {'vs Palisade':>12}")
    print("-" * 68)
    for key, name in ROWS:
        if key not in summary:
            continue
        rate = summary[key]["jobs_per_s_median"]
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"{name:<44} {rate:>10.0f} {ratio:>12}")
    lat = summary.get("latency_enqueue_to_claim_ms")
    if lat:
        print("-" * 68)
        print(
            f"{'Palisade idle enqueue->claim latency':<44} "
            f"p50 {lat['p50']:.1f} ms, p95 {lat['p95']:.1f} ms, max {lat['max']:.1f} ms "
            f"(n={lat['samples']})"
        )
    print()


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=4000, help="jobs per throughput scenario")
    p.add_argument("--workers", type=int, default=2, help="worker processes everywhere")
    p.add_argument("--repeat", type=int, default=1, help="run every scenario this many times")
    p.add_argument("--latency-samples", type=int, default=30)
    p.add_argument("--gap-min", type=float, default=0.05, help="seconds between latency samples")
    p.add_argument("--gap-max", type=float, default=0.30)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per scenario")
    p.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma list from {', '.join(SCENARIOS)}"
    )
    p.add_argument("--server", default=os.environ.get("BENCH_PG", DEFAULT_SERVER))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--q-poll",
        type=float,
        default=None,
        help="Q_POLL for Palisade's clusters (default: config.settings, 0.05 s)",
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios: {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    atexit.register(stop_all)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "logs").mkdir(exist_ok=True)
    bench = Bench(args)
    started = datetime.now(UTC)
    load_start = uptime()
    print(f"machine: {load_start}")
    print(f"creating {DB_NAME} and migrating ...", flush=True)
    bench.create_database()
    bench.setup_django()
    server = bench.server_info()
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeat):
            bench.rep = rep + 1
            run: dict[str, Any] = {}
            for key in SCENARIOS:
                if key not in args.only:
                    continue
                print(f"[{rep + 1}/{args.repeat}] {key} ...", end=" ", flush=True)
                load = os.getloadavg()[0]
                if key == "bare":
                    res = bench.run_bare()
                elif key == "sql":
                    res = bench.run_workers(sql_worker, "sql")
                elif key == "runner":
                    res = bench.run_workers(runner_worker, "runner")
                elif key == "palisade":
                    res = bench.run_palisade(8, latency=args.latency_samples > 0, label="palisade")
                elif key == "effects":
                    res = bench.run_palisade(
                        8, latency=False, label="effects", kind="demo.staged_effect"
                    )
                elif key == "batch1":
                    res = bench.run_palisade(1, latency=False, label="batch1")
                else:
                    res = bench.run_djq()
                res["loadavg_1m_before"] = load
                run[key] = res
                msg = f"{res['jobs_per_s']:.0f} jobs/s"
                if "latency" in res:
                    lat = res["latency"]["enqueue_to_claim_ms"]
                    msg += f"; idle latency p50 {lat['p50']:.1f} ms p95 {lat['p95']:.1f} ms"
                print(msg, flush=True)
            runs.append(run)
    finally:
        stop_all()
        if bench.conn is not None:
            bench.conn.close()
    summary = build_summary(runs)
    print_table(summary, args)
    load_end = uptime()
    print(f"machine: {load_end}")
    report = {
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {
            "cpus": os.cpu_count(),
            "uptime_start": load_start,
            "uptime_end": load_end,
        },
        "postgres": server,
        "summary": summary,
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        stop_all()
        print(f"\ninterrupted ({exc}); child processes stopped", file=sys.stderr)
        sys.exit(130)
