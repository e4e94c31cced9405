#!/usr/bin/env python
"""Single enqueue, one call and one commit each, against PostgreSQL's own floor, alternated in
one process; wall-clock rates and the CPU each call costs the client and the server.

    .venv/bin/python bench/enqueue_single.py [--rounds 5] [--n 500] [--pgbench-seconds 5]
        [--async-commit] [--before REF]

Each round, in a rotated order, on a database of its own (palisade_bench_enqueue, or
BENCH_ENQUEUE_DB), in autocommit:

  statement   `jobs.enqueue("demo.noop", {})`: one prepared statement (jobs/models/one_statement.py)
  keyed       the same with a fresh `unique_key` each call
  unprepared  the same with JOBS['ENQUEUE_PREPARE'] = "off" (what runs behind a pooler)
  before      with `--before REF`: jobs/models/one_statement.py and jobs/core/sql/enqueue.py as
              they were at git REF (e.g. the commit before this change), loaded from git into
              this process; the rules (jobs/core/enqueue.py) are today's
  before_unprepared
              the same, with ENQUEUE_PREPARE "off" (against `unprepared`)
  savepoint   the oldest path, kept as the fallback (`Job.objects._enqueue_with_savepoint`):
              BEGIN, INSERT job, INSERT event, COMMIT
  floor_py    one single-row INSERT into a scratch table (id bigserial, kind text, payload jsonb),
              prepared, through this process's psycopg connection: the floor with our client
  pgbench     `pgbench -n -c 1 -T S -f` (simple protocol) the same INSERT, one per transaction:
              the issue's floor
  pgbench_statement
              `pgbench -n -c 1 -T S -M prepared -f` Palisade's own enqueue statement (the one
              `statement` sends, its values as literals): what the server alone allows a
              `jobs.enqueue()`, with a client that costs next to nothing
  statement_waiting
              `statement` while a process waits for a wake-up (holds WAITER, as an idle drain
              does): the enqueue then NOTIFYs (migration 0022); without one it does not
  pgbench_cN, pgbench_statement_cN, pgbench_statement_cN_waiting
              with `--clients N` (default 8): pgbench's INSERT and the enqueue's statement from N
              concurrent clients, the statement also with a waiter (every commit a NOTIFY:
              PostgreSQL runs notifying commits one at a time)
  statement_in_tx, savepoint_in_tx
              the paths, N calls inside one `transaction.atomic()`: what an enqueue adds to
              the caller's transaction (the savepoint path: SAVEPOINT, 2 INSERTs, RELEASE)

Besides calls per second (wall clock of this process), every system but pgbench reports the CPU
one call costs: this thread's (client) and its PostgreSQL backend's (server, from the kernel's
/proc/<pid>/schedstat), and how long the backend waited for a CPU (runqueue) -- figures that the
other work on a shared machine disturbs far less than the wall clock.

`--async-commit` runs every system with `synchronous_commit = off` (pgbench too, by PGOPTIONS):
without the WAL flush per commit, what is left is round trips and CPU.

Rates: medians and ranges of the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
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
FLOOR = "INSERT INTO bench_floor (kind, payload) VALUES ('demo.noop', '{}')"


def pgbench(
    server: str, seconds: float, script: str = FLOOR, mode: str = "simple", clients: int = 1
) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script + ";\n")
    out = subprocess.run(
        ["pgbench", "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(int(seconds)),
         "-M", mode, "-f", f.name, f"{server}/{DB}"],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    os.unlink(f.name)
    found = re.search(r"tps = ([0-9.]+)", out.stdout)
    if not found:
        raise RuntimeError(f"pgbench printed no tps:\n{out.stdout}\n{out.stderr}")
    return float(found.group(1))


@contextlib.contextmanager
def waiting(server: str) -> Any:
    """A process waiting for a wake-up, as an idle drain does: enqueues NOTIFY meanwhile
    (migration 0022; jobs/core/sql/queues.py)."""
    import psycopg

    from jobs.core.sql.queues import WAIT_SQL

    with psycopg.connect(f"{server}/{DB}", autocommit=True) as conn:
        conn.execute(WAIT_SQL)
        yield


def schedstat(pid: int) -> tuple[int, int]:
    """(ns on a CPU, ns waiting for one) of process `pid` so far."""
    run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(run), int(wait)


def module_at(ref: str, path: str, name: str) -> Any:
    """`path` as it was at git `ref`, loaded as module `name` (its imports are today's)."""
    source = subprocess.run(
        ["git", "show", f"{ref}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass in it looks its module up there
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)  # noqa: S102 -- our own repo
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=500, help="enqueues per system per round")
    p.add_argument("--pgbench-seconds", type=float, default=5.0, help="0: skip pgbench")
    p.add_argument(
        "--clients", type=int, default=8,
        help="also pgbench with this many clients, the floor and the statement, with and "
        "without a waiter (1: skip)",
    )  # fmt: skip
    p.add_argument("--async-commit", action="store_true", help="synchronous_commit = off")
    p.add_argument("--before", metavar="REF", help="also time one_statement.py as of git REF")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "enqueue_single.json")
    args = p.parse_args()
    started, load_start = datetime.now(UTC), uptime()
    print(f"machine: {load_start}")
    palisade_database(args.server, DB)
    from django.db import connection, transaction
    from django.test.utils import override_settings

    from jobs import enqueue
    from jobs.core import enqueue as rules
    from jobs.models import Job, JobEvent

    with connection.cursor() as cur:
        cur.execute(SCRATCH)
        if args.async_commit:
            cur.execute("SET synchronous_commit = off")
            os.environ["PGOPTIONS"] = "-c synchronous_commit=off"  # for pgbench
    backend = connection.connection.info.backend_pid
    counter = iter(range(10**9))

    def statement() -> Any:
        return enqueue("demo.noop", {})

    def keyed() -> Any:
        return enqueue("demo.noop", {}, unique_key=f"k-{next(counter)}")

    def savepoint() -> Any:
        return Job.objects._enqueue_with_savepoint(rules.fields("demo.noop", {}))

    def floor_py() -> Any:
        with connection.connection.cursor() as cur:
            cur.execute(FLOOR, prepare=True)

    def in_tx(call: Any) -> Any:
        def run() -> None:
            with transaction.atomic():
                for _ in range(args.n):
                    call()

        return run

    systems: dict[str, Any] = {"statement": statement, "keyed": keyed, "unprepared": statement}
    # a system's settings, around its calls (not per call: a settings change clears caches)
    unprepared = {**settings_jobs(), "ENQUEUE_PREPARE": "off"}
    contexts = {"unprepared": lambda: override_settings(JOBS=unprepared)}
    if args.before:
        old = module_at(args.before, "jobs/models/one_statement.py", "one_statement_before")
        old.enqueue_sql = module_at(args.before, "jobs/core/sql/enqueue.py", "enqueue_sql_before")

        def before() -> Any:
            row = rules.fields("demo.noop", {})
            return old.enqueue(Job, JobEvent, connection, row, rules.UNIQUE_KEY_CONSTRAINT)

        systems["before"] = before
        systems["before_unprepared"] = before
        contexts["before_unprepared"] = contexts["unprepared"]
    systems.update(savepoint=savepoint, floor_py=floor_py)
    systems["statement_in_tx"] = in_tx(statement)
    systems["savepoint_in_tx"] = in_tx(savepoint)
    # the same with a process waiting for a wake-up (an idle cluster): the enqueue NOTIFYs
    systems["statement_waiting"] = statement
    contexts["statement_waiting"] = lambda: waiting(args.server)
    if args.pgbench_seconds:
        systems["pgbench"] = None
        systems["pgbench_statement"] = None
        own_statement = enqueue_statement_text(connection, enqueue)
        if args.clients > 1:
            c = args.clients
            systems[f"pgbench_c{c}"] = None
            systems[f"pgbench_statement_c{c}"] = None
            systems[f"pgbench_statement_c{c}_waiting"] = None
            contexts[f"pgbench_statement_c{c}_waiting"] = lambda: waiting(args.server)
    for name, call in systems.items():  # warm-up: prepared statements, caches, plans
        if call is not None and not name.endswith("_in_tx"):
            with contexts.get(name, contextlib.nullcontext)():
                for _ in range(20):
                    call()
    rates: dict[str, list[float]] = {name: [] for name in systems}
    cpu: dict[str, dict[str, list[float]]] = {
        name: {"client_us": [], "server_us": [], "server_wait_us": []}
        for name in systems
        if not name.startswith("pgbench")
    }
    names = list(systems)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if name == "pgbench":
                rates[name].append(pgbench(args.server, args.pgbench_seconds))
                continue
            if name == "pgbench_statement":
                rates[name].append(
                    pgbench(args.server, args.pgbench_seconds, own_statement, "prepared")
                )
                continue
            if name.startswith("pgbench_"):  # N clients: the floor, or the statement
                c = args.clients
                script, mode = (
                    (FLOOR, "simple") if name == f"pgbench_c{c}" else (own_statement, "prepared")
                )
                with contexts.get(name, contextlib.nullcontext)():
                    rates[name].append(pgbench(args.server, args.pgbench_seconds, script, mode, c))
                continue
            call = systems[name]
            server_before, client_before = schedstat(backend), time.thread_time_ns()
            with contexts.get(name, contextlib.nullcontext)():
                began = time.perf_counter()
                if name.endswith("_in_tx"):
                    call()
                else:
                    for _ in range(args.n):
                        call()
                rates[name].append(args.n / (time.perf_counter() - began))
            client, server = time.thread_time_ns(), schedstat(backend)
            cpu[name]["client_us"].append((client - client_before) / args.n / 1000)
            cpu[name]["server_us"].append((server[0] - server_before[0]) / args.n / 1000)
            cpu[name]["server_wait_us"].append((server[1] - server_before[1]) / args.n / 1000)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in rates.items()))
    print(f"\n{'system':<16} {'median/s':>9}  {'range':<12} CPU us/call: client, server (wait)")
    for name, values in rates.items():
        line = f"{name:<16} {statistics.median(values):9.0f}  {min(values):.0f}-{max(values):.0f}"
        if name in cpu:
            c = {k: statistics.median(v) for k, v in cpu[name].items()}
            line = f"{line:<40} {c['client_us']:6.0f} {c['server_us']:6.0f} "
            line += f"({c['server_wait_us']:.0f})"
        print(line)
    if "pgbench" in rates:
        floor = statistics.median(rates["pgbench"])
        for name in (
            "statement", "keyed", "unprepared", "before", "before_unprepared", "savepoint",
            "floor_py",
            "pgbench_statement", "statement_waiting",
        ):  # fmt: skip
            if name in rates:
                print(f"{name} / pgbench floor: {statistics.median(rates[name]) / floor:.0%}")
    c = args.clients
    if f"pgbench_c{c}" in rates:
        floor_c = statistics.median(rates[f"pgbench_c{c}"])
        for name in (f"pgbench_statement_c{c}", f"pgbench_statement_c{c}_waiting"):
            print(f"{name} / pgbench_c{c}: {statistics.median(rates[name]) / floor_c:.0%}")
    print(f"machine: {uptime()}")
    write_report(args.output, started, load_start, args, rates=rates, cpu_per_call=cpu)


def enqueue_statement_text(connection: Any, enqueue: Any) -> str:
    """The statement `jobs.enqueue("demo.noop", {})` sends, with its values as literals."""
    import psycopg

    from jobs.models import one_statement

    seen: list[tuple[str, list[Any]]] = []
    original = one_statement._execute

    def record(conn: Any, sql: str, params: list[Any]) -> Any:
        seen.append((sql, params))
        return original(conn, sql, params)

    one_statement._execute = record  # type: ignore[assignment]
    try:
        enqueue("demo.noop", {})
    finally:
        one_statement._execute = original  # type: ignore[assignment]
    sql, params = seen[0]
    return psycopg.ClientCursor(connection.connection).mogrify(sql, params)


def settings_jobs() -> dict[str, Any]:
    from django.conf import settings

    return dict(getattr(settings, "JOBS", {}) or {})


if __name__ == "__main__":
    main()
