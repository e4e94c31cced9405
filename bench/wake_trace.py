#!/usr/bin/env python
"""An idle drain woken by a burst, timed from inside: what its first milliseconds are spent on.

    .venv/bin/python bench/wake_trace.py [--jobs 4000] [--reps 4] [--rounds 2]

One process runs a worker's drain (`runner.drain(idle_wait=True)`: it LISTENs while the queue is
empty, as a django-q2 worker's drain does) on a database of its own (palisade_bench_wake, or
BENCH_WAKE_DB). Half a second into each repetition another process -- psql, as an application
would be -- commits `--jobs` no-op jobs in one INSERT, whose NOTIFY wakes the drain. The drain's
own calls are wrapped with timers (nothing else is changed): each claim and its size, the
wake-up's release (`Waker.release`) and each batch commit (the background thread's, or the
runner's own while that thread is busy). Printed
per repetition: the first calls from the first claim that found work, and the rate from that
claim to the end of the last commit.

Three variants, alternated over `--rounds`:

  lazy    as shipped: the background thread opens its database connection at its first commit
  early   the thread opens it as the drain starts, before the burst arrives (not shipped:
          docs/benchmarks.md, the fifth, fourteenth and seventeenth sessions)
  warm    early, and the thread runs the batch commit's statement once over no rows

Nothing here is a test. Writes bench/results/wake_trace.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, uptime  # noqa: E402
from bench.systems import palisade_database  # noqa: E402

DB = os.environ.get("BENCH_WAKE_DB", "palisade_bench_wake")

VARIANTS = ("lazy", "early", "warm")
Event = tuple[str, int, float, float]  # what, jobs, start, end (perf_counter)


def instrument(events: list[Event]) -> None:
    """Wrap the drain's calls with timers (module attributes: the drain looks them up)."""
    from jobs.core import transitions
    from jobs.worker import completer, listener, runner

    claim = transitions.claim

    def timed_claim(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        rows = claim(*args, **kwargs)
        events.append(("claim", len(rows), t0, time.perf_counter()))
        return rows

    runner.transitions.claim = timed_claim  # type: ignore[attr-defined]

    commit = completer.commit

    def timed_commit(items: Any) -> None:
        t0 = time.perf_counter()
        commit(items)
        events.append(("commit", len(items), t0, time.perf_counter()))

    completer.commit = timed_commit  # type: ignore[assignment]

    release = listener.Waker.release

    def timed_release(self: Any) -> None:
        if not self._waiting:  # nothing to give back: returns at once (after every batch)
            release(self)
            return
        t0 = time.perf_counter()
        release(self)
        events.append(("wake-up release", 0, t0, time.perf_counter()))

    listener.Waker.release = timed_release  # type: ignore[method-assign]


def connect_early(warm: bool) -> None:
    """The `early` variant: the drain's background thread connects as it starts; `warm`: and
    runs the batch commit's statement once over no rows (its session set up, the statement
    prepared and planned)."""
    from django.db import connection

    from jobs.core.transitions.fence import driver, fenced_statement, hot_cursor
    from jobs.worker import heartbeat

    loop = heartbeat.Heartbeater._loop

    def early_loop(self: Any) -> None:
        connection.ensure_connection()
        if warm:
            with fenced_statement(), hot_cursor() as cur:
                driver().commit(cur, "warm:0", [])
        loop(self)

    heartbeat.Heartbeater._loop = early_loop  # type: ignore[method-assign]


def burst(server: str, n: int) -> None:
    time.sleep(0.5)
    subprocess.run(
        ["psql", "-q", "-X", f"{server}/{DB}", "-c",
         f"INSERT INTO jobs_job (kind) SELECT 'demo.noop' FROM generate_series(1, {int(n)})"],
        check=True, timeout=120,
    )  # fmt: skip


def run(args: argparse.Namespace, variant: str) -> list[dict[str, Any]]:
    """One variant in a process of its own (each wraps the drain differently)."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", variant, "--jobs", str(args.jobs),
         "--reps", str(args.reps), "--server", args.server],
        cwd=ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{variant}: {out.stderr[-3000:]}")
    return [json.loads(line[5:]) for line in out.stdout.splitlines() if line.startswith("REP: ")]


def child(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.db import connection

    from jobs.worker import runner

    events: list[Event] = []
    instrument(events)
    if args.child in ("early", "warm"):
        connect_early(warm=args.child == "warm")
    runner.drain(budget_seconds=0.2)  # the connection and its statements, as a worker's are
    for _ in range(args.reps):
        with connection.cursor() as cur:
            cur.execute("TRUNCATE jobs_job, jobs_attempt, jobs_jobevent CASCADE")
        events.clear()
        sender = threading.Thread(target=burst, args=(args.server.rstrip("/"), args.jobs))
        sender.start()
        # The drain returns at its budget's end (it waits for more work until then): a budget
        # too short for this machine leaves jobs behind, and the rate would be a partial one's.
        ran = runner.drain(budget_seconds=1.5 + args.jobs / 1000, idle_wait=True)
        sender.join()
        if ran != args.jobs:
            raise SystemExit(f"the drain ran {ran} of {args.jobs} jobs within its budget")
        events.sort(key=lambda e: e[2])
        first = next(e for e in events if e[0] == "claim" and e[1] > 0)
        t0 = first[2]
        last = max(e[3] for e in events if e[0] == "commit")
        shown = [e for e in events if e[2] >= t0][:12]
        rep = {
            "ran": ran,
            "jobs_per_s": args.jobs / (last - t0),
            "first": [
                {"what": w, "jobs": n, "from_ms": (a - t0) * 1e3, "ms": (b - a) * 1e3}
                for w, n, a, b in shown
            ],
        }
        print("REP: " + json.dumps(rep), flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--reps", type=int, default=4, help="repetitions per variant and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    print(f"machine: {uptime()}")
    palisade_database(args.server.rstrip("/"), DB, JOBS_LOG_LEVEL="WARNING")
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            reps = run(args, variant)
            results[variant].extend(reps)
            rates = [x["jobs_per_s"] for x in reps]
            print(f"round {r + 1} {variant}: median {statistics.median(rates):,.0f} jobs/s "
                  f"({min(rates):,.0f}-{max(rates):,.0f})")  # fmt: skip
            for e in reps[-1]["first"]:
                print(f"    {e['what']:<16} {e['jobs']:>3} jobs  at {e['from_ms']:6.2f} ms"
                      f"  took {e['ms']:5.2f} ms")  # fmt: skip
    for variant, reps in results.items():
        rates = [x["jobs_per_s"] for x in reps]
        print(f"{variant}: {statistics.median(rates):,.0f} jobs/s over {len(rates)} repetitions")
    path = RESULTS_DIR / "wake_trace.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": uptime(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
