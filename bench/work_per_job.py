#!/usr/bin/env python
"""The database's work per job, which a loaded machine disturbs far less than throughput.

    DATABASE_URL=postgres://.../palisade_bench_x .venv/bin/python bench/work_per_job.py \\
        [--mode sql|runner] [--jobs 4000] [--batch 8]

One process drains N bulk-inserted no-op jobs -- `sql`: Palisade's claim and batch-commit
statements (jobs.core.sql.PostgresDriver) on a raw autocommit psycopg connection; `runner`:
`jobs.worker.runner.drain()` in this process -- while a sampler process reads the CPU time of
every PostgreSQL backend of the database from /proc (Linux; the server on this machine). Prints
wall, client CPU and server CPU per job. The database is migrated by the caller (bench/run.py's
setup or `manage.py migrate`); its jobs tables are emptied first. Nothing here is a test.
Used in docs/benchmarks.md (2026-12-01 evening) to price each change to the hot path.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def backend_cpu(database: str) -> dict[str, float]:
    """CPU seconds (user + system) of each backend process serving `database`."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                cmd = f.read()
            if cmd.startswith(b"postgres: ") and database.encode() + b" " in cmd:
                pid = path.split("/")[2]
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[pid] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return out


def sampler(database: str, flag: str) -> None:
    """Until `flag` exists: the highest CPU time seen of each backend; prints the growth."""
    first = backend_cpu(database)
    peak = dict(first)
    print("ready", flush=True)
    while True:
        done = os.path.exists(flag)
        for pid, cpu in backend_cpu(database).items():
            peak[pid] = max(peak.get(pid, 0.0), cpu)
        if done:
            break
        time.sleep(0.05)
    print(sum(cpu - first.get(pid, 0.0) for pid, cpu in peak.items()), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("sql", "runner"), default="sql")
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["JOBS_CLAIM_BATCH"] = str(args.batch)
    sys.path.insert(0, str(ROOT))
    import django

    import bench.protocol  # noqa: F401  -- like every benchmark: no .env (DEBUG there logs queries)

    django.setup()
    from django.db import connection

    from jobs.models import Job

    if connection.vendor != "postgresql":
        raise SystemExit("PostgreSQL only: set DATABASE_URL")
    database = connection.settings_dict["NAME"]
    with connection.cursor() as cur:
        cur.execute("TRUNCATE jobs_job, jobs_attempt, jobs_jobevent RESTART IDENTITY CASCADE")
    Job.objects.bulk_create([Job(kind="demo.noop", payload={}) for _ in range(args.jobs)])
    with connection.cursor() as cur:
        for table in ("jobs_job", "jobs_attempt", "jobs_jobevent"):
            cur.execute(f"VACUUM ANALYZE {table}")
        cur.execute("CHECKPOINT")
    flag = f"/tmp/work_per_job.{os.getpid()}"
    watcher = subprocess.Popen(
        [sys.executable, __file__, "--sampler", database, flag], stdout=subprocess.PIPE, text=True
    )
    assert watcher.stdout is not None
    watcher.stdout.readline()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if args.mode == "sql":
        import psycopg

        from jobs.core.sql import CommitRow, PostgresDriver

        driver = PostgresDriver()
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            with conn.cursor() as cur:
                while rows := driver.claim(cur, "bench:1", args.batch, 30.0, None, {}):
                    rows = [CommitRow(r.id, r.attempt, None, "") for r in rows]
                    driver.commit(cur, "bench:1", rows)
            time.sleep(0.1)  # the sampler sees the last statement's CPU
    else:
        from jobs.worker import runner

        while runner.drain():
            pass
        time.sleep(0.1)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    Path(flag).touch()
    server = float(watcher.stdout.readline())
    os.remove(flag)
    done = Job.objects.filter(state="succeeded").count()
    n = args.jobs
    print(
        f"{args.mode} batch {args.batch}: {done}/{n} jobs; wall {1e6 * (wall1 - wall0) / n:.0f}"
        f" us/job, client CPU {1e6 * (cpu1 - cpu0) / n:.0f} us/job, server CPU"
        f" {1e6 * server / n:.0f} us/job; {os.popen('uptime').read().strip()}"
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--sampler":
        sampler(sys.argv[2], sys.argv[3])
    else:
        main()
