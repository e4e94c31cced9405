#!/usr/bin/env python
"""Where a job's time goes: py-spy samples of the drain hot path, grouped.

    .venv/bin/python bench/profile_drain.py [--jobs 20000] [--rate 997]

One plain Django process runs `jobs.worker.runner.drain()` (claim batch 8, no django-q2) over N
no-op jobs under `py-spy record --idle --threads` (py-spy from its own cached venv, see
bench/peers.py),
and every sample of the draining thread is put in one bucket by its innermost recognisable frame:
waiting on PostgreSQL (socket), psycopg's own work (adapting, parsing), Django's cursor and ORM
layers, JSON, logging, Palisade's own code (runner, completer, transitions, jobs.core.sql), the
handler. The heartbeat thread's samples are reported apart (it runs beside the drain). Prints a
table of shares and the per-job wall time; writes bench/results/profile.json and the raw
collapsed stacks (for flame graphs) to bench/results/profile-stacks.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, uptime  # noqa: E402
from bench.systems import palisade_database  # noqa: E402

DB = "palisade_bench_profile"
PYSPY_VENV = Path.home() / ".cache" / "palisade-bench" / "venvs" / "py-spy"

DRAIN = """
import django, time
django.setup()
from jobs.worker import runner
from jobs.models import Job
Job.objects.bulk_create([Job(kind="demo.noop", payload={{}}) for _ in range({n})])
t0 = time.perf_counter()
ran = 0
while (k := runner.drain()):
    ran += k
print("DRAINED", ran, time.perf_counter() - t0, flush=True)
"""

# innermost frame first: the first rule whose marker appears in a frame names the bucket
BUCKETS = [
    ("handler (demo.noop)", ("demo/handlers.py",)),
    ("waiting on PostgreSQL (round trips)", ("Connection.wait", "waiting.py", "wait_c")),
    ("idle (thread waits)", ("Condition.wait", "Event.wait", "_wait_for_tstate_lock")),
    ("json", ("json/",)),
    ("logging", ("logging/",)),
    ("psycopg (adapt, parse, protocol)", ("psycopg/", "psycopg_c/", "psycopg_binary/")),
    ("Django cursor/ORM/transactions", ("django/",)),
    ("Palisade: jobs.core.sql", ("jobs/core/sql/",)),
    ("Palisade: transitions", ("jobs/core/transitions/",)),
    ("Palisade: completer", ("jobs/worker/completer.py",)),
    (
        "Palisade: runner, context, policy",
        ("jobs/worker/runner.py", "jobs/context.py", "jobs/core/policy.py"),
    ),
    ("Palisade: other", ("jobs/",)),
]


def pyspy() -> Path:
    exe = PYSPY_VENV / "bin" / "py-spy"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PYSPY_VENV)], check=True)
        subprocess.run([str(PYSPY_VENV / "bin" / "pip"), "install", "-q", "py-spy"], check=True)
    return exe


def bucket(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost first
        for name, markers in BUCKETS:
            if any(m in frame for m in markers):
                return name
    return "other (interpreter, stdlib)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--rate", type=int, default=997, help="py-spy samples per second")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    args = p.parse_args()
    server = args.server.rstrip("/")
    print(f"machine: {uptime()}")
    env = palisade_database(server, DB, JOBS_LOG_LEVEL="WARNING")
    raw = RESULTS_DIR / "profile-stacks.txt"
    raw.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    out = subprocess.run(
        [str(pyspy()), "record", "--idle", "--threads", "--rate", str(args.rate),
         "--format", "raw", "--output", str(raw), "--nonblocking", "--",
         sys.executable, "-c", DRAIN.format(n=args.jobs)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    wall = time.monotonic() - t0
    line = next((x for x in out.stdout.splitlines() if x.startswith("DRAINED")), None)
    if out.returncode != 0 or line is None:
        print(out.stdout[-3000:], out.stderr[-3000:])
        return 1
    _, ran, seconds = line.split()
    drain_s = float(seconds)
    main_counts: Counter[str] = Counter()
    beat_counts: Counter[str] = Counter()
    waits: Counter[str] = Counter()
    for entry in raw.read_text().splitlines():
        stack, _, count = entry.rpartition(" ")
        frames = stack.split(";")
        if any("heartbeat.py" in f for f in frames) and not any("runner.py" in f for f in frames):
            beat_counts[bucket(frames)] += int(count)
        elif any("runner.py" in f for f in frames):
            name = bucket(frames)
            main_counts[name] += int(count)
            if name.startswith("waiting"):
                # which Palisade call was waiting: the innermost frame in jobs/
                own = [f for f in frames if "jobs/" in f]
                waits[own[-1].split(" (")[0] if own else "?"] += int(count)
    total = sum(main_counts.values())
    per_job_us = drain_s / int(ran) * 1e6
    print(f"\n{ran} jobs drained in {drain_s:.2f} s under py-spy: {per_job_us:.0f} us per job")
    print(f"{'where the draining thread spends its time':<44} {'share':>7} {'us/job':>8}")
    print("-" * 62)
    table = []
    for name, count in main_counts.most_common():
        share = count / total
        table.append({"bucket": name, "share": round(share, 4), "us_per_job": share * per_job_us})
        print(f"{name:<44} {share:>6.1%} {share * per_job_us:>8.0f}")
    wait_total = sum(waits.values())
    print("\nthe waits, by the Palisade call that made them:")
    for name, count in waits.most_common(8):
        print(f"  {name:<42} {count / max(wait_total, 1):>6.1%} {count / total * per_job_us:>8.0f}")
    beat_total = sum(beat_counts.values())
    share_beat = beat_total / max(total, 1)
    print(f"\nheartbeat thread: {beat_total} samples ({share_beat:.0%} of the drain's)")
    for name, count in beat_counts.most_common(5):
        print(f"  {name:<42} {count / max(beat_total, 1):>6.1%}")
    (RESULTS_DIR / "profile.json").write_text(
        json.dumps(
            {
                "jobs": int(ran),
                "drain_s": drain_s,
                "wall_s": wall,
                "us_per_job": per_job_us,
                "rate": args.rate,
                "draining_thread": table,
                "waits_by_call": dict(waits),
                "heartbeat_thread": dict(beat_counts),
            },
            indent=2,
        )
    )
    print(f"\nresults: {RESULTS_DIR / 'profile.json'}; stacks: {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
