#!/usr/bin/env python
"""A claim beside a blocked queue's backlog: how long one claim of 8 takes from `default` while
another queue, paused, holds N older jobs at the head of the claim order.

    .venv/bin/python bench/blocked_queue.py [--backlogs 0,10000,100000] [--claims 50] [--rounds 2]

Each round, for each backlog size, on a database of its own (palisade_bench_blocked, or
BENCH_BLOCKED_DB): N jobs in queue `bulk`, an hour old, 4,000 due in `default`, `bulk` paused,
ANALYZE; then `--claims` claims of 8 through `jobs.core.transitions.claim` (the claim a worker
makes), timed one by one. Two picks, alternated: `now` (jobs_pick as migrated: with a queue
blocked it takes each other queue's rows from jobs_job_queue_pick_idx, migration 0019) and
`0018` (jobs_pick as migration 0018 created it, put back for the round: the walk of
jobs_job_pick_idx that filters the blocked rows out). Prints p50 / p99 per claim.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import uptime  # noqa: E402
from bench.systems import palisade_database  # noqa: E402

DB = os.environ.get("BENCH_BLOCKED_DB", "palisade_bench_blocked")
PICKS = {"now": "0019_pick_around_blocked_queues", "0018": "0018_steady_pick"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backlogs", default="0,10000,100000")
    p.add_argument("--claims", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    args = p.parse_args()
    print(f"machine: {uptime()}")
    palisade_database(args.server, DB)
    from django.db import connection

    from jobs.core import transitions

    def sql(statement: str, params: list[object] | None = None) -> None:
        with connection.cursor() as cur:
            cur.execute(statement, params)

    results: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for backlog in [int(b) for b in args.backlogs.split(",")]:
            order = list(PICKS) if r % 2 == 0 else list(reversed(PICKS))
            for pick in order:
                sql(import_module(f"jobs.migrations.{PICKS[pick]}").CREATE)
                sql("TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, jobs_queuecontrol CASCADE")
                sql(
                    "INSERT INTO jobs_job (kind, queue, run_at) SELECT 'demo.noop', 'bulk',"
                    " now() - interval '1 hour' FROM generate_series(1, %s)",
                    [backlog],
                )
                sql("INSERT INTO jobs_job (kind) SELECT 'demo.noop' FROM generate_series(1, 4000)")
                sql("INSERT INTO jobs_queuecontrol (queue, paused) VALUES ('bulk', true)")
                sql("ANALYZE jobs_job")
                times = []
                for _ in range(args.claims):
                    t = time.perf_counter()
                    got = transitions.claim("bench-blocked:1", limit=8, lease_seconds=60)
                    times.append((time.perf_counter() - t) * 1000)
                    if len(got) != 8:
                        raise RuntimeError(f"claimed {len(got)} of 8")
                results.setdefault((pick, backlog), []).extend(times)
                times.sort()
                p50, p99 = statistics.median(times), times[int(len(times) * 0.99)]
                print(
                    f"round {r + 1}: {pick:>4} beside {backlog:>7} paused:"
                    f" p50 {p50:.2f} ms p99 {p99:.2f}"
                )
    sql(import_module(f"jobs.migrations.{PICKS['now']}").CREATE)
    print("\npick  paused backlog  claim of 8: p50 ms  p99 ms  (all rounds)")
    for (pick, backlog), times in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        times.sort()
        print(
            f"{pick:>4}  {backlog:>14}  {statistics.median(times):>17.2f}"
            f"  {times[int(len(times) * 0.99)]:>6.2f}"
        )
    print(f"machine: {uptime()}")


if __name__ == "__main__":
    main()
