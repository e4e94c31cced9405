#!/usr/bin/env python
"""Future work costs the claim nothing; wake-ups only for the queues a cluster serves (issue 16.7).

    .venv/bin/python bench/future.py [--future 1000000] [--due 2000] [--claims 1000] [--db NAME]

claim    `--future` jobs scheduled a day ahead (inserted as the enqueue trigger leaves them:
         deferred), then `--due` due jobs: the latency of `transitions.claim(limit=1)` (one
         autocommit statement, as a drain sends it) while due jobs remain, of an idle claim (none
         due) and of the scheduler's due count; p50 / p99 / max over `--claims` calls each.
wake-ups five LISTENers as five clusters would hold them (`jobs.worker.listener.Waker`): one
         per queue a, b, c, d and one serving every queue; 200 enqueues spread over a..e, one
         transaction each; wake-ups each listener reported, per enqueue into a queue it serves
         and per enqueue into one it does not.

Database: palisade_bench_future (dropped and recreated; `--db`). Writes bench/results/future.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, summarize, uptime  # noqa: E402
from bench.systems import palisade_database, write_report  # noqa: E402


def execute(query: str, params: Any = None) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)


def timed(call: Any, n: int) -> dict[str, float]:
    took = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        took.append((time.perf_counter() - t) * 1000)
    return summarize(took)


def measure_claims(args: argparse.Namespace) -> dict[str, Any]:
    from jobs.core import transitions

    t = time.monotonic()
    print(f"  inserting {args.future:,} future rows ...", flush=True)
    # As the trigger leaves such rows (deferred), without firing it a million times.
    execute("SET session_replication_role = replica")
    from django.db import connection

    with connection.cursor() as cur:  # (a tree from before migration 0010 has no such column)
        columns = {c.name for c in connection.introspection.get_table_description(cur, "jobs_job")}
    flag = ("", "") if "deferred" not in columns else (", deferred", ", true")
    execute(
        f"INSERT INTO jobs_job (kind, run_at{flag[0]}) SELECT 'demo.work', "
        f"clock_timestamp() + interval '1 day' + g * interval '1 ms'{flag[1]} "
        "FROM generate_series(1, %s) g",
        [args.future],
    )
    execute("SET session_replication_role = origin")
    execute(
        "INSERT INTO jobs_job (kind) SELECT 'demo.work' FROM generate_series(1, %s)", [args.due]
    )
    execute("VACUUM ANALYZE jobs_job")
    loaded = time.monotonic() - t
    n = min(args.claims, args.due)
    busy = timed(lambda: transitions.claim("bench:1", limit=1, lease_seconds=30), n)
    execute("UPDATE jobs_job SET state = 'cancelled', finished_at = now() WHERE state <> 'queued'")
    execute("DELETE FROM jobs_job WHERE state = 'queued' AND run_at < now() + interval '1 hour'")
    idle = timed(lambda: transitions.claim("bench:1", limit=1, lease_seconds=30), args.claims)
    due = timed(lambda: transitions.count_due(8), args.claims)
    return {"future_rows": args.future, "load_s": round(loaded, 1), "claim_with_due_ms": busy,
            "claim_idle_ms": idle, "count_due_ms": due}  # fmt: skip


def measure_wakeups() -> dict[str, Any]:
    import jobs
    from jobs.worker.listener import Waker

    served = {"a": ["a"], "b": ["b"], "c": ["c"], "d": ["d"], "all": None}
    woke = dict.fromkeys(served, 0)
    ready = threading.Barrier(len(served) + 1)
    stop = threading.Event()

    def listen(name: str, queues: list[str] | None) -> None:
        from django.db import connections

        waker = Waker(queues=queues)
        waker.wait(0.01)  # LISTEN now (a fresh LISTEN reports one wake-up: not counted)
        waker.wait(0.01)  # registered as a waiter, past the fence (reported once: not counted)
        ready.wait()
        while not stop.is_set():
            woke[name] += waker.wait(0.05)
        waker.close()
        connections.close_all()

    threads = [threading.Thread(target=listen, args=item) for item in served.items()]
    for th in threads:
        th.start()
    ready.wait()
    sent = dict.fromkeys("abcde", 0)
    for i in range(200):
        queue = "abcde"[i % 5]
        jobs.enqueue("demo.work", {"ms": 1}, queue=queue)
        sent[queue] += 1
        time.sleep(0.02)  # one enqueue at a time, each heard on its own
    time.sleep(0.5)  # the last notifications arrive
    stop.set()
    for th in threads:
        th.join()
    out: dict[str, Any] = {"enqueues": sent}
    for name, queues in served.items():
        own = sum(n for q, n in sent.items() if queues is None or q in queues)
        out[name] = {"wakeups": woke[name], "per_enqueue_served": woke[name] / own,
                     "enqueues_not_served": sum(sent.values()) - own}  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--future", type=int, default=1_000_000)
    p.add_argument("--due", type=int, default=2000)
    p.add_argument("--claims", type=int, default=1000)
    p.add_argument("--db", default="palisade_bench_future")
    p.add_argument("--skip-wakeups", action="store_true")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "future.json")
    args = p.parse_args()
    started, load_start = datetime.now(UTC), uptime()
    print(f"machine: {load_start}")
    palisade_database(args.server.rstrip("/"), args.db)
    wake = measure_wakeups() if not args.skip_wakeups else {}
    for name in ("a", "b", "c", "d", "all") if wake else ():
        w = wake[name]
        print(
            f"  listener {name:<4} {w['wakeups']:>4} wake-ups: {w['per_enqueue_served']:.2f} per"
            f" enqueue it serves ({w['enqueues_not_served']} enqueues into other queues)"
        )
    claims = measure_claims(args)
    print(f"  {args.future:,} future rows (loaded in {claims['load_s']} s):")
    for label in ("claim_with_due_ms", "claim_idle_ms", "count_due_ms"):
        s = claims[label]
        print(f"    {label:<18} p50 {s['p50']:.2f} ms  p99 {s['p99']:.2f} ms  max {s['max']:.2f}")
    write_report(args.output, started, load_start, args, claims=claims, wakeups=wake)
    return 0


if __name__ == "__main__":
    sys.exit(main())
