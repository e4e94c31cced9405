#!/usr/bin/env python
"""Palisade against the peers a Django team would pick instead, measured in one run.

    .venv/bin/python bench/run.py [--jobs 4000] [--workers 2] [--repeat 3] [--only a,b]

Systems (one module each under bench/systems/; the peers run in their own virtual environments,
installed from the package index on first use and cached, see bench/peers.py):

  palisade       Palisade's qcluster, claim batch 64 (default)     bench/systems/palisade.py
  batch8         the same with JOBS_CLAIM_BATCH=8 (like for like with graphile_lq8)
  batch1         the same with JOBS_CLAIM_BATCH=1
  effects        the same drain of jobs that each stage one small output and record one effect
  tasks          the same drain of a django.tasks @task no-op (jobs.tasks.PalisadeBackend)
  sql            Palisade's own claim + batch commit SQL in a raw loop: its SQL floor (batch 64)
  sql8           the same at batch 8: the floor of batch8
  runner         jobs.worker.runner.drain() in plain processes: no django-q2, no scheduler
  bare           a minimal fenced claim/commit loop on a table of its own
  celery         Celery 5 + Redis (the machine's, no persistence)    bench/systems/celery.py
  celery_aof     the same on a Redis of its own with appendfsync always (durable, like Palisade)
  djq_orm        django-q2 alone, ORM broker                        bench/systems/django_peers.py
  djq_redis      django-q2 alone, Redis broker
  procrastinate  procrastinate 3 (PostgreSQL, LISTEN/NOTIFY)        bench/systems/procrastinate.py
  dtdb           django-tasks-db's db_worker                        bench/systems/django_peers.py
  graphile       graphile-worker 0.17 (Node), defaults              bench/systems/node.py
  graphile_lq8   the same, localQueue 8 + completion batching (like for like with batch8)
  graphile_perf  the same, its documented performance settings
  pgboss         pg-boss 10 (Node), batchSize 100, 0.5 s polling

The protocol (bench/protocol.py) is the same for all; each repeat runs every system, in an order
rotated by one per repeat, and the table shows medians. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, median, stop_all, uptime  # noqa: E402
from bench.systems import Context  # noqa: E402
from bench.systems.celery import Celery, CeleryAof  # noqa: E402
from bench.systems.django_peers import DjangoQ2Orm, DjangoQ2Redis, DjangoTasksDB  # noqa: E402
from bench.systems.node import NODE_SYSTEMS  # noqa: E402
from bench.systems.palisade import (  # noqa: E402
    Bare,
    Decomposition,
    Palisade,
    PalisadeBatch1,
    PalisadeBatch8,
    PalisadeDB,
    PalisadeEffects,
    PalisadeTasks,
)
from bench.systems.procrastinate import Procrastinate  # noqa: E402

SYSTEMS: list[Any] = [
    Palisade(),
    PalisadeBatch8(),
    PalisadeBatch1(),
    PalisadeEffects(),
    PalisadeTasks(),
    Decomposition("sql", "Palisade SQL floor (raw loop, batch 64)", "sql_worker"),
    Decomposition("sql8", "Palisade SQL floor (raw loop, batch 8)", "sql_worker", batch=8),
    Decomposition("runner", "runner.drain(), no django-q2", "runner_worker"),
    Bare(),
    Celery(),
    CeleryAof(),
    DjangoQ2Orm(),
    DjangoQ2Redis(),
    Procrastinate(),
    DjangoTasksDB(),
    *NODE_SYSTEMS,
]
KEYS = [s.key for s in SYSTEMS]
PEERS = [
    "celery", "celery_aof", "djq_orm", "djq_redis", "procrastinate", "dtdb",
    *(s.key for s in NODE_SYSTEMS),
]  # fmt: skip
# Peers whose acknowledged enqueue lives in memory only (the machine's Redis keeps nothing on disk).
NOT_DURABLE = {"celery", "djq_redis"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=4000, help="jobs per drain")
    p.add_argument("--workers", type=int, default=2, help="worker processes everywhere")
    p.add_argument("--repeat", type=int, default=1, help="run every system this many times")
    p.add_argument("--enqueue-single", type=int, default=1000, help="jobs for the single rate")
    p.add_argument("--latency-samples", type=int, default=30)
    p.add_argument("--gap-min", type=float, default=0.05, help="seconds between latency samples")
    p.add_argument("--gap-max", type=float, default=0.30)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    p.add_argument("--only", default=",".join(KEYS), help=f"comma list from {', '.join(KEYS)}")
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--q-poll", type=float, default=None, help="Q_POLL for Palisade's clusters")
    p.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json")
    args = p.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(KEYS)
    if unknown:
        p.error(f"unknown systems: {sorted(unknown)}")
    return args


def build_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for key in KEYS:
        results = [r[key] for r in runs if key in r and "error" not in r[key]]
        if not results:
            continue
        s: dict[str, Any] = {
            "jobs_per_s_median": median([x["jobs_per_s"] for x in results]),
            "jobs_per_s_all": [round(x["jobs_per_s"], 1) for x in results],
        }
        for kind in ("single_per_s", "bulk_per_s"):
            vals = [x["enqueue"][kind] for x in results if "enqueue" in x]
            if vals:
                s[f"enqueue_{kind}_median"] = median(vals)
        lat = [v for x in results if "latency" in x for v in x["latency"]["raw_ms"]]
        if lat:
            from bench.protocol import summarize

            s["latency_enqueue_to_start_ms"] = summarize(lat)
        rss = [x["peak_rss"]["max_mb"] for x in results if "peak_rss" in x]
        if rss:
            s["peak_rss_mb_max"] = max(rss)
        summary[key] = s
    for drain, floor in (("palisade", "sql"), ("batch8", "sql8")):
        pairs = [
            r[drain]["jobs_per_s"] / r[floor]["jobs_per_s"]
            for r in runs
            if "jobs_per_s" in r.get(drain, {}) and "jobs_per_s" in r.get(floor, {})
        ]
        if pairs:
            # Each repetition's ratio: the drain and its floor a few seconds apart, so whatever
            # the machine did that minute weighs on both. The median of these is steadier than
            # the ratio of the two medians (a 4,000-job drain lasts under half a second).
            summary[drain]["floor_ratio_median"] = median(pairs)
            summary[drain]["floor_ratio_all"] = [round(x, 2) for x in pairs]
    return summary


def floor_line(summary: dict[str, Any], drain: str, floor: str, what: str) -> str | None:
    if drain not in summary or floor not in summary:
        return None
    ratio = summary[drain]["jobs_per_s_median"] / summary[floor]["jobs_per_s_median"]
    line = f"{what}: {ratio:.2f} (ratio of the medians)"
    if "floor_ratio_median" in summary[drain]:
        pairs = summary[drain]["floor_ratio_all"]
        line += (
            f"; by repetition {summary[drain]['floor_ratio_median']:.2f} "
            f"(median; {min(pairs):.2f}-{max(pairs):.2f})"
        )
    return line


def cell(s: dict[str, Any], key: str, width: int) -> str:
    return f"{s[key]:>{width}.0f}" if key in s else " " * width


def print_table(summary: dict[str, Any], args: argparse.Namespace) -> None:
    base = summary.get("palisade", {}).get("jobs_per_s_median")
    names = {s.key: s.label for s in SYSTEMS}
    print()
    print(f"N = {args.jobs} no-op jobs, {args.workers} workers, medians of {args.repeat}")
    head = (
        f"{'system':<42} {'drain/s':>8} {'Pal/x':>6} {'enq 1/s':>8} {'enq bulk/s':>10} "
        f"{'idle p50':>9} {'idle p99':>9} {'RSS MB':>7}"
    )
    print(head)
    print("-" * len(head))
    for key in KEYS:
        if key not in summary:
            continue
        s = summary[key]
        rate = s["jobs_per_s_median"]
        lat = s.get("latency_enqueue_to_start_ms", {})
        cells = [
            f"{names[key]:<42}",
            f"{rate:>8.0f}",
            f"{base / rate:>5.2f}x" if base else f"{'-':>6}",
            cell(s, "enqueue_single_per_s_median", 8),
            cell(s, "enqueue_bulk_per_s_median", 10),
            f"{lat['p50']:>7.1f}ms" if lat else f"{'':>9}",
            f"{lat['p99']:>7.1f}ms" if lat else f"{'':>9}",
            f"{s['peak_rss_mb_max']:>7.0f}" if "peak_rss_mb_max" in s else f"{'':>7}",
        ]  # fmt: skip
        print(" ".join(cells))
    peers = {k: summary[k]["jobs_per_s_median"] for k in PEERS if k in summary}
    if base and peers:
        fastest = max(peers, key=lambda k: peers[k])
        print("-" * len(head))
        print(f"Palisade / fastest peer ({names[fastest]}): {base / peers[fastest]:.2f}x")
    for drain, floor, what in (
        ("palisade", "sql", "Palisade / its own SQL floor"),
        ("batch8", "sql8", "Palisade batch 8 / its SQL floor at batch 8"),
    ):
        line = floor_line(summary, drain, floor, what)
        if line:
            print(line)
    enqueue = summary.get("palisade", {}).get("enqueue_single_per_s_median")
    rates = {
        k: summary[k]["enqueue_single_per_s_median"]
        for k in PEERS
        if "enqueue_single_per_s_median" in summary.get(k, {})
    }
    for durable_only in (False, True):
        among = {k: v for k, v in rates.items() if not (durable_only and k in NOT_DURABLE)}
        if enqueue and among:
            fastest = max(among, key=lambda k: among[k])
            which = "durable peer" if durable_only else "peer"
            print(
                f"Palisade single enqueue / fastest {which}'s ({names[fastest]}): "
                f"{enqueue / among[fastest]:.2f}x"
            )
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    atexit.register(stop_all)
    (RESULTS_DIR / "logs").mkdir(parents=True, exist_ok=True)
    ctx = Context(args=args, server=args.server.rstrip("/"))
    chosen = [s for s in SYSTEMS if s.key in args.only]
    started = datetime.now(UTC)
    load_start = uptime()
    print(f"machine: {load_start}")
    for system in chosen:
        print(f"setting up {system.key} ...", flush=True)
        system.setup(ctx)
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeat):
            ctx.rep = rep + 1
            order = chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]
            run: dict[str, Any] = {}
            for system in order:
                print(f"[{rep + 1}/{args.repeat}] {system.key} ...", end=" ", flush=True)
                load = os.getloadavg()[0]
                try:
                    res = system.measure(ctx)
                except Exception as exc:  # noqa: BLE001 (one system's failure must not hide the others)
                    traceback.print_exc()
                    run[system.key] = {"error": repr(exc)}
                    print("FAILED", flush=True)
                    continue
                res["loadavg_1m_before"] = load
                run[system.key] = res
                msg = f"{res['jobs_per_s']:.0f} jobs/s"
                if "latency" in res:
                    lat = res["latency"]["enqueue_to_start_ms"]
                    msg += f"; idle p50 {lat['p50']:.1f} ms p99 {lat['p99']:.1f} ms"
                print(msg, flush=True)
            runs.append(run)
    finally:
        stop_all()
    summary = build_summary(runs)
    print_table(summary, args)
    load_end = uptime()
    print(f"machine: {load_end}")
    report = {
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "uptime_start": load_start, "uptime_end": load_end},
        "postgres": PalisadeDB.server_info() if PalisadeDB.ready else {},
        "versions": ctx.versions,
        "summary": summary,
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        stop_all()
        print("\ninterrupted; child processes stopped", file=sys.stderr)
        sys.exit(130)
