#!/usr/bin/env python
"""Single enqueue, one call and one commit each: the one-statement enqueue against the previous
four round trips, and against PostgreSQL's own floor, alternated in one process.

    .venv/bin/python bench/enqueue_single.py [--rounds 5] [--n 500] [--pgbench-seconds 5]

Each round, in a rotated order, on a database of its own (palisade_bench_enqueue, or
BENCH_ENQUEUE_DB), in autocommit:

  statement   `jobs.enqueue("demo.noop", {})`, one statement on PostgreSQL (sql/enqueue.py)
  keyed       the same with a fresh `unique_key` each call
  savepoint   the previous implementation, kept as the fallback path
              (`Job.objects._enqueue_with_savepoint`): BEGIN, INSERT job, INSERT event, COMMIT
  pgbench     `pgbench -n -c 1 -T S -f` one single-row INSERT per transaction into a scratch
              table (id bigserial, kind text, payload jsonb): the floor of one durable commit
  statement_in_tx, savepoint_in_tx
              the two paths, N calls inside one `transaction.atomic()`: what an enqueue adds to
              the caller's transaction (the savepoint path: SAVEPOINT, 2 INSERTs, RELEASE)

`--async-commit` runs every system with `synchronous_commit = off` (pgbench too, by PGOPTIONS):
without the WAL flush per commit, what is left is round trips and CPU -- the part this change
removes, and the only part still measurable when other work on the machine saturates the disk.

Rates are calls per second by the wall clock of this process; medians and ranges of the rounds.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, uptime  # noqa: E402
from bench.systems import palisade_database, write_report  # noqa: E402

DB = os.environ.get("BENCH_ENQUEUE_DB", "palisade_bench_enqueue")
SCRATCH = (
    "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, kind text, payload jsonb)"
)


def pgbench(server: str, seconds: float) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write("INSERT INTO bench_floor (kind, payload) VALUES ('demo.noop', '{}');\n")
    out = subprocess.run(
        ["pgbench", "-n", "-c", "1", "-T", str(int(seconds)), "-f", f.name, f"{server}/{DB}"],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    os.unlink(f.name)
    found = re.search(r"tps = ([0-9.]+)", out.stdout)
    if not found:
        raise RuntimeError(f"pgbench printed no tps:\n{out.stdout}\n{out.stderr}")
    return float(found.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=500, help="enqueues per system per round")
    p.add_argument("--pgbench-seconds", type=float, default=5.0, help="0: skip pgbench")
    p.add_argument("--async-commit", action="store_true", help="synchronous_commit = off")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "enqueue_single.json")
    args = p.parse_args()
    started, load_start = datetime.now(UTC), uptime()
    print(f"machine: {load_start}")
    palisade_database(args.server, DB)
    from django.db import connection, transaction

    from jobs import enqueue
    from jobs.core import enqueue as rules
    from jobs.models import Job

    with connection.cursor() as cur:
        cur.execute(SCRATCH)
        if args.async_commit:
            cur.execute("SET synchronous_commit = off")
            os.environ["PGOPTIONS"] = "-c synchronous_commit=off"  # for pgbench
    counter = iter(range(10**9))

    def statement() -> Any:
        return enqueue("demo.noop", {})

    def keyed() -> Any:
        return enqueue("demo.noop", {}, unique_key=f"k-{next(counter)}")

    def savepoint() -> Any:
        return Job.objects._enqueue_with_savepoint(rules.fields("demo.noop", {}))

    def in_tx(call: Any) -> Any:
        def run() -> None:
            with transaction.atomic():
                for _ in range(args.n):
                    call()

        return run

    systems: dict[str, Any] = {"statement": statement, "keyed": keyed, "savepoint": savepoint}
    systems["statement_in_tx"] = in_tx(statement)
    systems["savepoint_in_tx"] = in_tx(savepoint)
    if args.pgbench_seconds:
        systems["pgbench"] = None
    rates: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if name == "pgbench":
                rates[name].append(pgbench(args.server, args.pgbench_seconds))
                continue
            call = systems[name]
            began = time.perf_counter()
            if name.endswith("_in_tx"):
                call()
            else:
                for _ in range(args.n):
                    call()
            rates[name].append(args.n / (time.perf_counter() - began))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in rates.items()))
    print(f"\n{'system':<10} {'median/s':>9}  range")
    for name, values in rates.items():
        print(f"{name:<10} {statistics.median(values):9.0f}  {min(values):.0f}-{max(values):.0f}")
    if "pgbench" in rates:
        floor = statistics.median(rates["pgbench"])
        for name in ("statement", "keyed", "savepoint"):
            print(f"{name} / pgbench floor: {statistics.median(rates[name]) / floor:.0%}")
    print(f"machine: {uptime()}")
    write_report(args.output, started, load_start, args, rates=rates)


if __name__ == "__main__":
    main()
