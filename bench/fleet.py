#!/usr/bin/env python
"""Many workers, one database: K `qcluster`s x 2 workers (processes on this machine stand in for
hosts) draining one PostgreSQL, directly and through PgBouncer in transaction pooling.

    .venv/bin/python bench/fleet.py [--clusters 8] [--workers 2] [--jobs 8000]
                                   [--modes direct,pgbouncer]

For each mode: N demo.noop jobs inserted, K clusters started together, and while they drain the
connections to the database are sampled from pg_stat_activity every 50 ms. Reported: drain rate
(N / (last finish - first claim), database clock), peak and mean server connections, and the
correctness checks -- every job succeeded exactly once, and no two attempts of one job ran at the
same time unless the earlier one was fenced off (expired, lost, rejected or released).

PgBouncer (Debian's `pgbouncer`, started here on 127.0.0.1:6432 as the postgres user, pool_mode
transaction, default_pool_size 20) sits between every cluster and PostgreSQL. Database:
palisade_bench_fleet. Writes bench/results/fleet.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, spawn, stop, stop_all, uptime, wait_for  # noqa: E402
from bench.systems import palisade_database, write_report  # noqa: E402

DB = "palisade_bench_fleet"
BOUNCER_PORT = 6432

OVERLAPS = """
SELECT count(*) FROM jobs_attempt a JOIN jobs_attempt b
    ON a.job_id = b.job_id AND a.number < b.number
 WHERE b.claimed_at < coalesce(a.ended_at, 'infinity')
   AND a.outcome NOT IN ('expired', 'lost', 'rejected', 'released')
"""


def start_pgbouncer(server_port: int, pool_size: int) -> tuple[subprocess.Popen[bytes], Path]:
    exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(exe).exists():
        raise RuntimeError("pgbouncer is not installed (apt-get install -y pgbouncer)")
    work = Path(tempfile.mkdtemp(prefix="palisade-pgbouncer-"))
    (work / "users.txt").write_text('"postgres" ""\n')
    (work / "pgbouncer.ini").write_text(
        f"""[databases]
{DB} = host=127.0.0.1 port={server_port} dbname={DB}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {BOUNCER_PORT}
unix_socket_dir =
auth_type = trust
auth_file = {work / "users.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
logfile = {work / "pgbouncer.log"}
pidfile = {work / "pgbouncer.pid"}
"""
    )
    shutil.chown(work, "postgres")
    for f in work.iterdir():
        shutil.chown(f, "postgres")
    cmd = [exe, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:
        cmd[1:1] = ["-u", "postgres"]
    log = RESULTS_DIR / "logs" / "pgbouncer.log"
    proc = spawn(cmd, dict(os.environ), log)

    def ready() -> bool:
        try:
            with psycopg.connect(
                f"postgres://postgres@127.0.0.1:{BOUNCER_PORT}/{DB}", connect_timeout=1
            ) as c:
                c.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    wait_for(ready, 15, "pgbouncer start", [proc], interval=0.1)
    return proc, work


def measure(args: argparse.Namespace, mode: str, server: str) -> dict[str, Any]:
    from jobs.models import Job

    direct = f"{server}/{DB}"
    admin = psycopg.connect(direct, autocommit=True)
    admin.execute(
        "TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, django_q_ormq, django_q_task "
        "RESTART IDENTITY CASCADE"
    )
    Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(args.jobs)])
    admin.execute("VACUUM ANALYZE jobs_job")
    bouncer = None
    url = direct
    if mode == "pgbouncer":
        bouncer, _ = start_pgbouncer(int(server.rsplit(":", 1)[1]), args.pool_size)
        url = f"postgres://postgres@127.0.0.1:{BOUNCER_PORT}/{DB}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": url,
        "JOBS_WORKERS": str(args.workers),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    if mode == "pgbouncer":  # PgBouncer 1.18 keeps no prepared statements (docs/operations.md)
        env["JOBS_PREPARED_STATEMENTS"] = "0"
    env.pop("REDIS_URL", None)
    samples: list[int] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        with psycopg.connect(direct, autocommit=True) as conn:
            while not stop_sampling.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid()",
                    (DB,),
                ).fetchone()
                samples.append(int(row[0]) if row else 0)
                stop_sampling.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    procs = [
        spawn(
            [sys.executable, "manage.py", "qcluster"],
            env,
            RESULTS_DIR / "logs" / f"fleet-{mode}-{i}.log",
        )
        for i in range(args.clusters)
    ]
    result: dict[str, Any] = {"mode": mode, "clusters": args.clusters, "workers": args.workers}
    try:

        def drained() -> bool:
            row = admin.execute(
                "SELECT count(*) FILTER (WHERE state = 'succeeded'), "
                "count(*) FILTER (WHERE state IN ('failed', 'cancelled')) FROM jobs_job"
            ).fetchone()
            assert row is not None
            if row[1]:
                raise RuntimeError(f"{mode}: {row[1]} jobs ended badly")
            return bool(row[0] >= args.jobs)

        wait_for(drained, args.timeout, f"fleet {mode}", procs, interval=0.05)
        first, last, attempts, workers_seen = admin.execute(
            "SELECT min(a.claimed_at), max(j.finished_at), count(a.id), count(DISTINCT a.worker) "
            "FROM jobs_job j JOIN jobs_attempt a ON a.job_id = j.id"
        ).fetchone()  # type: ignore[misc]
        span = (last - first).total_seconds()
        overlaps = admin.execute(OVERLAPS).fetchone()[0]  # type: ignore[index]
        succeeded_twice = admin.execute(
            "SELECT count(*) FROM (SELECT job_id FROM jobs_attempt WHERE outcome = 'succeeded' "
            "GROUP BY job_id HAVING count(*) > 1) x"
        ).fetchone()[0]  # type: ignore[index]
        result.update(
            jobs=args.jobs,
            span_s=round(span, 3),
            jobs_per_s=args.jobs / span,
            attempts=attempts,
            workers_seen=workers_seen,
            concurrent_runs_outside_a_fence=overlaps,
            jobs_succeeded_twice=succeeded_twice,
            rejected_writes=admin.execute("SELECT count(*) FROM jobs_rejectedwrite").fetchone()[0],  # type: ignore[index]
        )
    finally:
        for p in procs:
            stop(p, grace=20)
        stop_sampling.set()
        sampler.join(timeout=5)
        if bouncer is not None:
            stop(bouncer)
        admin.close()
    result["server_connections"] = {
        "peak": max(samples) if samples else None,
        "mean": round(sum(samples) / len(samples), 1) if samples else None,
    }
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clusters", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--jobs", type=int, default=8000)
    p.add_argument("--modes", default="direct,pgbouncer")
    p.add_argument("--pool-size", type=int, default=20)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "fleet.json")
    args = p.parse_args()
    server = args.server.rstrip("/")
    started = datetime.now(UTC)
    load_start = uptime()
    print(f"machine: {load_start}")
    palisade_database(server, DB)
    results = []
    try:
        for mode in args.modes.split(","):
            print(f"{mode}: {args.clusters} clusters x {args.workers} workers ...", flush=True)
            try:
                res = measure(args, mode, server)
            except Exception as exc:  # noqa: BLE001 (report the mode that failed, run the rest)
                res = {"mode": mode, "error": repr(exc)}
                print(f"  FAILED: {exc!r}", flush=True)
            else:
                c = res["server_connections"]
                print(
                    f"  {res['jobs_per_s']:.0f} jobs/s; server connections peak {c['peak']} "
                    f"mean {c['mean']}; attempts {res['attempts']} for {res['jobs']} jobs; "
                    f"concurrent runs outside a fence {res['concurrent_runs_outside_a_fence']}; "
                    f"succeeded twice {res['jobs_succeeded_twice']}",
                    flush=True,
                )
            results.append(res)
    finally:
        stop_all()
    write_report(args.output, started, load_start, args, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
