#!/usr/bin/env python
"""The drain's client work per job in instructions: what a busy machine cannot disturb.

    .venv/bin/python bench/instructions.py [--small 200] [--large 2200] [--before REF]

Runs under `valgrind --tool=callgrind --separate-threads=yes`, on a database of its own
(palisade_bench_instr, dropped and recreated: `--db` or BENCH_INSTR_DB for another, so that
two people measuring at once do not drop each other's; `--server` or BENCH_PG for another server):

  runner   `jobs.worker.runner.drain()` in one process until the queue is empty (the draining
           thread and the drain's background thread, which commits)
  sql      Palisade's own claim and batch-commit statements (jobs.core.sql.PostgresDriver) in a
           raw loop on one psycopg connection: the SQL floor `bench/run.py` compares with
  before   with `--before REF`: `runner` on the tree at git REF (a temporary worktree, this
           venv), for the same jobs

The claim batch is held at 64 (JOBS_CLAIM_BATCH, the default cap) for the runner too: its
adaptive batch grows by how long claims take against handlers, and under valgrind the client is
~50x slower while the server is not, so the batch would stay small and the claim's share would
not be the one a real drain has. Each system drains `--small` then `--large` no-op jobs (inserted
by generate_series, vacuumed); instructions per job = the difference of the two runs' totals over
the difference of their jobs, so the interpreter's start and Django's setup cancel out. Thread
1 is the draining thread; the others are the drain's background thread (the runner's commits
and heartbeats) and any the process starts. Whatever else the machine does, the runner's
total varies by ~2-3 % run to run (its commits batch differently each time: 135,096 / 137,421 /
138,948 for one tree on 2026-12-07), the split between its threads by more; the SQL floor's by
~0.1 %. Compare medians of a few runs. The server's work is not counted (bench/work_per_job.py
reads it, in CPU time). Nothing here is a test. Writes bench/results/instructions.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVER = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = os.environ.get("BENCH_INSTR_DB", "palisade_bench_instr")  # one per engineer measuring


def child(system: str) -> None:
    """Inside valgrind: drain every queued job, one way or the other."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["JOBS_CLAIM_BATCH"] = "64"
    sys.path.insert(0, os.getcwd())
    import gc

    import django

    import bench.protocol  # noqa: F401  -- like every benchmark: no .env (DEBUG logs queries)

    django.setup()
    gc.freeze()  # as a worker process does after its start
    if system == "sql":
        import psycopg

        from jobs.core.sql import CommitRow, PostgresDriver

        driver = PostgresDriver()
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            with conn.cursor() as cur:
                while rows := driver.claim(cur, "bench:1", 64, 30.0, None, {}):
                    rows = [CommitRow(r.id, r.attempt, None, "") for r in rows]
                    driver.commit(cur, "bench:1", rows)
        return
    from jobs.core import policy
    from jobs.worker import runner

    policy.next_claim_batch = lambda current, per_job, cap, claim_seconds=0.0: cap
    while runner.drain():
        pass


def migrate(tree: Path, url: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings"}
    env.setdefault("SECRET_KEY", "palisade-bench-only")
    cmd = [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"]
    subprocess.run(cmd, cwd=tree, env=env, check=True)


def queue(url: str, jobs: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, jobs_rejectedwrite CASCADE")
        conn.execute(
            "INSERT INTO jobs_job (kind) SELECT 'demo.noop' FROM generate_series(1, %s)", [jobs]
        )
        for table in ("jobs_job", "jobs_attempt", "jobs_jobevent"):
            conn.execute(f"VACUUM ANALYZE {table}")
        done = conn.execute("SELECT count(*) FROM jobs_job").fetchone()
        assert done is not None and done[0] == jobs


def count(tree: Path, url: str, system: str, jobs: int) -> dict[str, int]:
    """Instructions of each thread of one drain of `jobs` jobs (thread number -> count)."""
    import psycopg

    queue(url, jobs)
    out = tempfile.mkdtemp(prefix="palisade-instr-")
    env = {**os.environ, "DATABASE_URL": url, "PYTHONHASHSEED": "0"}
    env.setdefault("SECRET_KEY", "palisade-bench-only")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        f"--callgrind-out-file={out}/cg",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        system,
    ]
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True)
    threads = {}
    for path in sorted(glob.glob(f"{out}/cg-*")):
        with open(path) as f:
            for line in f:
                if line.startswith("summary:"):
                    threads[int(path.rsplit("-", 1)[1])] = int(line.split()[1])
                    break
    shutil.rmtree(out)
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM jobs_job WHERE state <> 'succeeded'").fetchone()
    if left is None or left[0]:
        raise SystemExit(f"{system}: {left} jobs not succeeded after the drain")
    return threads


def per_job(small: dict[str, int], large: dict[str, int], jobs: int) -> dict[str, float]:
    main = (large.get("1", 0) - small.get("1", 0)) / jobs
    total = (sum(large.values()) - sum(small.values())) / jobs
    return {"total": total, "draining thread": main, "other threads": total - main}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=200)
    p.add_argument("--large", type=int, default=2200)
    p.add_argument("--before", help="a git ref: also measure the runner on that tree")
    p.add_argument("--server", default=SERVER)
    p.add_argument(
        "--db",
        default=DB,
        help="the database to drop, recreate and drain (default palisade_bench_instr, or "
        "BENCH_INSTR_DB): two people measuring at once each need their own",
    )
    p.add_argument(
        "--floor",
        type=float,
        help="the SQL floor's instructions a job from an earlier run (its loop is not run again)",
    )
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install -y valgrind)")
    import psycopg
    from psycopg import sql

    db = sql.Identifier(args.db)
    with psycopg.connect(f"{args.server}/postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(db))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(db))
    url = f"{args.server}/{args.db}"
    trees: list[tuple[str, Path, str]] = [("runner", ROOT, "runner")]
    if args.floor is None:
        trees.append(("sql", ROOT, "sql"))
    worktree = None
    if args.before:
        worktree = Path(tempfile.mkdtemp(prefix="palisade-before-")) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), args.before],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        trees.append((f"before ({args.before})", worktree, "runner"))
    results: dict[str, Any] = {}
    try:
        for name, tree, system in trees:
            migrate(tree, url)
            small = {str(k): v for k, v in count(tree, url, system, args.small).items()}
            large = {str(k): v for k, v in count(tree, url, system, args.large).items()}
            results[name] = {
                "small": small,
                "large": large,
                "per_job": per_job(small, large, args.large - args.small),
            }
            print(f"{name}: done", file=sys.stderr, flush=True)
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)
    floor = args.floor or results["sql"]["per_job"]["total"]
    print(f"\nclient instructions per no-op job (claim batch 64; {args.small} -> {args.large})")
    print(f"{'system':28s} {'total':>9s} {'draining':>9s} {'others':>9s} {'/ floor':>8s}")
    for name, r in results.items():
        j = r["per_job"]
        print(
            f"{name:28s} {j['total']:9,.0f} {j['draining thread']:9,.0f}"
            f" {j['other threads']:9,.0f} {j['total'] / floor:7.2f}x"
        )
    out = ROOT / "bench" / "results" / "instructions.json"
    out.parent.mkdir(exist_ok=True)
    meta = {"args": vars(args), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out.write_text(json.dumps({**meta, "results": results}, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        main()
