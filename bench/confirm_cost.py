"""What telling "never started" from "ran" costs per job, measured in one run.

The reaper charges an expired attempt only if its handler was confirmed running. For a normal job
the confirmation rides on the background heartbeat (no statement of its own); a job that has
already had an uncharged attempt is confirmed explicitly, one fenced UPDATE before its handler
runs. This drains N no-op jobs in-process with `runner.drain()` both ways, alternating rounds:

    .venv/bin/python bench/confirm_cost.py [--jobs 3000] [--rounds 3]

It drops and recreates the database `palisade_bench_confirm` on postgres://postgres@127.0.0.1:5432
and prints jobs/s for each mode and the per-job cost of the explicit confirmation.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

# A measurement never reads a developer's .env (bin/setup --dev): DEBUG there logs every query.
os.environ.setdefault("PALISADE_ENV_FILE", "none")

ROOT = Path(__file__).resolve().parents[1]
SERVER = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = "palisade_bench_confirm"


def prepare() -> str:
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB}")
    url = f"{SERVER}/{DB}"
    os.environ.setdefault("SECRET_KEY", "palisade-bench-only")  # DEBUG is off
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings"}
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
    subprocess.run(migrate, cwd=ROOT, env=env, check=True)
    return url


def drain_rate(jobs: int, released: bool) -> float:
    from django.db import connection

    from jobs.worker import runner

    attempt, released_n = (1, 1) if released else (0, 0)
    with connection.cursor() as cur:
        cur.execute("TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, jobs_rejectedwrite CASCADE")
        cur.execute(
            "INSERT INTO jobs_job (kind, attempt, attempts_released) "
            "SELECT 'demo.noop', %s, %s FROM generate_series(1, %s)",
            [attempt, released_n, jobs],
        )
        cur.execute("CHECKPOINT")
    started = time.perf_counter()
    done = 0
    while ran := runner.drain():
        done += ran
    elapsed = time.perf_counter() - started
    assert done == jobs, f"drained {done} of {jobs}"
    return jobs / elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    os.environ["DATABASE_URL"] = prepare()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    rates: dict[str, list[float]] = {"plain": [], "explicit confirm": []}
    for _ in range(args.rounds):
        rates["plain"].append(drain_rate(args.jobs, released=False))
        rates["explicit confirm"].append(drain_rate(args.jobs, released=True))
    plain = statistics.median(rates["plain"])
    confirm = statistics.median(rates["explicit confirm"])
    print(f"runner.drain(), 1 process, {args.jobs} no-op jobs, median of {args.rounds} rounds")
    print(f"  plain jobs (confirmed by the heartbeat): {plain:8.0f} jobs/s")
    ratio = confirm / plain
    print(f"  jobs with a released attempt (explicit): {confirm:8.0f} jobs/s  ({ratio:.2f}x)")
    print(f"  explicit confirmation costs {1e6 / confirm - 1e6 / plain:.0f} us per job")


if __name__ == "__main__":
    main()
