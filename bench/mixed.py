#!/usr/bin/env python
"""Real work, not only no-ops: Palisade on a mixed workload, per-class latency.

    .venv/bin/python bench/mixed.py [--workers 2,4] [--jobs 1000] [--duration 60] [--util 0.5]
    .venv/bin/python bench/mixed.py --urgent [--workers 2] [--jobs 120]

The mix (seeded): 90% fast jobs sleeping 1-5 ms, 9% medium 50-200 ms, 1% slow 2-5 s
(`demo.work`, a plain sleep). For each worker count it measures, on one `manage.py qcluster`
(the default claim batch, JOBS_CLAIM_BATCH 64: past 8 only where claims cost, jobs.core.policy):

  drain      N mixed jobs inserted while no cluster runs: N / (last finish - first claim).
  open loop  jobs enqueued one at a time (autocommit) at Poisson arrivals whose rate keeps the
             workers `--util` busy (rate = util x workers / mean service time) for `--duration`
             seconds; then enqueue -> finish per class (jobs_job.created_at -> finished_at, both
             the database clock): p50 / p95 / p99. This is the case where batching must not hold
             fast jobs behind slow ones.

With --urgent instead (issue 16, item 2): a low-priority backlog -- 64 quick jobs, which grow
the drains' claim batch to 8, then `--jobs` handlers of 100-400 ms -- and, once it runs, one urgent
priority-10 quick job every second while it lasts. Reported: enqueue -> start of each urgent job
(its first claim, and the claim of the attempt that ran it), its attempt number, and hand-offs
(released attempts) per job over the whole run. Target: an urgent job starts within 0.5 s (the
next worker to free up takes it) and hand-offs per job <= 0.2.

Database: palisade_bench_mixed (dropped and recreated; `--db`). Writes bench/results/mixed.json
(`mixed-urgent.json` with --urgent).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, spawn, stop, stop_all, summarize, uptime, wait_for  # noqa: E402
from bench.systems import palisade_database, write_report  # noqa: E402

DB = "palisade_bench_mixed"
CLASSES = (("fast", 0.90, 1.0, 5.0), ("medium", 0.09, 50.0, 200.0), ("slow", 0.01, 2000.0, 5000.0))
MEAN_MS = sum(share * (lo + hi) / 2 for _, share, lo, hi in CLASSES)


def ideal_fifo(arrivals: list[tuple[float, str, float]], servers: int) -> dict[str, Any]:
    """The same arrivals (seconds, class, ms) through a perfect FIFO queue with `servers`
    servers and zero overhead: the latency no scheduler without priorities can beat."""
    import heapq

    free = [0.0] * servers
    per: dict[str, list[float]] = {}
    for at, cls, ms in sorted(arrivals):
        start = max(at, heapq.heappop(free))
        end = start + ms / 1000
        heapq.heappush(free, end)
        per.setdefault(cls, []).append((end - at) * 1000)
    return {cls: summarize(v) for cls, v in per.items()}


def pick(rng: random.Random) -> tuple[str, float]:
    x = rng.random()
    for name, share, lo, hi in CLASSES:
        if x < share:
            return name, rng.uniform(lo, hi)
        x -= share
    name, _, lo, hi = CLASSES[-1]
    return name, rng.uniform(lo, hi)


def execute(query: str) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query)


def one(query: str, params: Any = None) -> tuple[Any, ...]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(query, params)
        row = cur.fetchone()
    assert row is not None
    return tuple(row)


def all_done(proc: Any, timeout: float) -> None:
    def check() -> bool:
        left, bad = one(
            "SELECT count(*) FILTER (WHERE state IN ('queued', 'running')), "
            "count(*) FILTER (WHERE state IN ('failed', 'cancelled')) FROM jobs_job"
        )
        if bad:
            raise RuntimeError(f"{bad} jobs ended badly")
        return bool(left == 0)

    wait_for(check, timeout, "mixed", [proc], interval=0.05)


def measure(args: argparse.Namespace, env: dict[str, str], workers: int) -> dict[str, Any]:
    from jobs import enqueue
    from jobs.models import Job

    rng = random.Random(args.seed + workers)
    execute(
        "TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, django_q_ormq, django_q_task "
        "RESTART IDENTITY CASCADE"
    )
    jobs = []
    for _ in range(args.jobs):
        cls, ms = pick(rng)
        jobs.append(Job(kind="demo.work", payload={"ms": ms, "class": cls}))
    Job.objects.bulk_create(jobs)
    execute("VACUUM ANALYZE jobs_job")
    log = RESULTS_DIR / "logs" / f"mixed-w{workers}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    proc = spawn(
        [sys.executable, "manage.py", "qcluster"], {**env, "JOBS_WORKERS": str(workers)}, log
    )
    result: dict[str, Any] = {"workers": workers}
    try:
        all_done(proc, args.timeout)
        first, last = one(
            "SELECT min(a.claimed_at), max(j.finished_at) FROM jobs_job j "
            "JOIN jobs_attempt a ON a.job_id = j.id"
        )
        span = (last - first).total_seconds()
        work_s = sum(j.payload["ms"] for j in jobs) / 1000
        result["drain"] = {
            "jobs": args.jobs,
            "span_s": round(span, 2),
            "jobs_per_s": args.jobs / span,
            "work_s": round(work_s, 2),
            "ideal_span_s": round(work_s / workers, 2),
            "efficiency": round(work_s / workers / span, 3),
        }
        # open loop
        rate = args.util * workers / (MEAN_MS / 1000)
        execute("TRUNCATE jobs_job, jobs_attempt, jobs_jobevent RESTART IDENTITY CASCADE")
        t_end = time.monotonic() + args.duration
        sent = 0
        arrivals: list[tuple[float, str, float]] = []
        began = next_at = time.monotonic()
        while True:
            next_at += rng.expovariate(rate)
            if next_at > t_end:
                break
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            cls, ms = pick(rng)
            enqueue("demo.work", {"ms": ms, "class": cls})
            arrivals.append((time.monotonic() - began, cls, ms))
            sent += 1
        all_done(proc, args.timeout)
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                "SELECT payload->>'class', extract(epoch FROM finished_at - created_at) * 1000, "
                "extract(epoch FROM a.claimed_at - j.created_at) * 1000 FROM jobs_job j "
                "JOIN jobs_attempt a ON a.job_id = j.id AND a.number = 1"
            )
            rows = cur.fetchall()
        per: dict[str, Any] = {}
        for name, *_ in CLASSES:
            finish = [float(r[1]) for r in rows if r[0] == name]
            start = [float(r[2]) for r in rows if r[0] == name]
            per[name] = {
                "enqueue_to_finish_ms": summarize(finish),
                "enqueue_to_start_ms": summarize(start),
            }
        result["open_loop"] = {
            "utilisation_target": args.util,
            "arrival_rate_per_s": round(rate, 2),
            "jobs": sent,
            "duration_s": args.duration,
            "per_class": per,
            "ideal_fifo_per_class": ideal_fifo(arrivals, workers),
        }
    finally:
        stop(proc)
    return result


def measure_urgent(args: argparse.Namespace, env: dict[str, str], workers: int) -> dict[str, Any]:
    from jobs import enqueue
    from jobs.models import Job

    rng = random.Random(args.seed + workers)
    execute(
        "TRUNCATE jobs_job, jobs_attempt, jobs_jobevent, django_q_ormq, django_q_task "
        "RESTART IDENTITY CASCADE"
    )
    quick = [Job(kind="demo.work", payload={"ms": 1.0, "class": "quick"}) for _ in range(64)]
    slow = [
        Job(kind="demo.work", payload={"ms": rng.uniform(100.0, 400.0), "class": "backlog"})
        for _ in range(args.jobs)
    ]
    Job.objects.bulk_create(quick + slow)
    log = RESULTS_DIR / "logs" / f"mixed-urgent-w{workers}.log"
    knobs = {"JOBS_WORKERS": str(workers)}
    if args.drain_seconds:
        knobs["JOBS_DRAIN_SECONDS"] = str(args.drain_seconds)
    proc = spawn([sys.executable, "manage.py", "qcluster"], {**env, **knobs}, log)
    try:
        wait_for(
            lambda: one("SELECT count(*) FROM jobs_job WHERE state = 'succeeded'")[0] > 70,
            60, "backlog start", [proc], interval=0.05,
        )  # fmt: skip
        urgent = 0
        while one("SELECT count(*) FROM jobs_job WHERE state = 'queued'")[0] > 2 * workers:
            enqueue("demo.work", {"ms": 1.0, "class": "urgent"}, priority=10)
            urgent += 1
            time.sleep(1.0 + rng.random() * 0.1)  # the benchmark's arrival gap, not a sync
        all_done(proc, args.timeout)
        rows = list(
            Job.objects.filter(payload__class="urgent").values_list("id", "attempt", "created_at")
        )
        first, ran = [], []
        for job_id, _, created in rows:
            claims = one(
                "SELECT min(claimed_at), max(claimed_at) FILTER (WHERE outcome = 'succeeded') "
                "FROM jobs_attempt WHERE job_id = %s",
                [job_id],
            )
            first.append((claims[0] - created).total_seconds() * 1000)
            ran.append((claims[1] - created).total_seconds() * 1000)
        released, total = one(
            "SELECT (SELECT count(*) FROM jobs_attempt WHERE outcome = 'released'), "
            "(SELECT count(*) FROM jobs_job)"
        )
    finally:
        stop(proc)
    return {
        "workers": workers,
        "backlog_jobs": args.jobs,
        "urgent_jobs": urgent,
        "urgent_first_claim_ms": summarize(first),
        "urgent_start_ms": summarize(ran),
        "urgent_attempts": sorted({r[1] for r in rows}),
        "handoffs_per_job": released / total,
        "jobs": total,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", default="2,4")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--util", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--server", default=os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
    )
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--urgent", action="store_true", help="the urgent-job-behind-a-backlog run")
    p.add_argument("--db", default=DB, help="the database to recreate")
    p.add_argument("--drain-seconds", type=float, default=0.0, help="JOBS_DRAIN_SECONDS (--urgent)")
    args = p.parse_args()
    args.output = args.output or RESULTS_DIR / (
        "mixed-urgent.json" if args.urgent else "mixed.json"
    )
    started = datetime.now(UTC)
    load_start = uptime()
    print(f"machine: {load_start}; mean service time {MEAN_MS:.2f} ms")
    env = palisade_database(args.server.rstrip("/"), args.db)
    results = []
    try:
        for workers in [int(w) for w in args.workers.split(",")]:
            print(f"{workers} workers ...", flush=True)
            if args.urgent:
                res = measure_urgent(args, env, workers)
                results.append(res)
                f, r = res["urgent_first_claim_ms"], res["urgent_start_ms"]
                print(
                    f"  {res['urgent_jobs']} urgent jobs behind {res['backlog_jobs']}: first claim "
                    f"p50 {f['p50']:.0f} ms max {f['max']:.0f}; start p50 {r['p50']:.0f} ms "
                    f"max {r['max']:.0f}; attempts {res['urgent_attempts']}; hand-offs per job "
                    f"{res['handoffs_per_job']:.3f}"
                )
                continue
            res = measure(args, env, workers)
            results.append(res)
            d = res["drain"]
            print(
                f"  drain {d['jobs_per_s']:.0f} jobs/s ({d['span_s']} s; ideal "
                f"{d['ideal_span_s']} s; efficiency {d['efficiency']:.0%})"
            )
            ol = res["open_loop"]
            print(f"  open loop {ol['jobs']} jobs at {ol['arrival_rate_per_s']}/s:")
            for name, stats in ol["per_class"].items():
                f = stats["enqueue_to_finish_ms"]
                ideal = ol["ideal_fifo_per_class"].get(name, {})
                if f:
                    print(
                        f"    {name:<7} n={f['n']:<5} enqueue->finish p50 {f['p50']:>8.1f} ms "
                        f"p95 {f['p95']:>8.1f} p99 {f['p99']:>8.1f} max {f['max']:>8.1f}"
                        f"   (perfect FIFO, {workers} servers: p50 {ideal.get('p50', 0):.1f} "
                        f"p99 {ideal.get('p99', 0):.1f})"
                    )
    finally:
        stop_all()
    write_report(args.output, started, load_start, args, mean_service_ms=MEAN_MS, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
