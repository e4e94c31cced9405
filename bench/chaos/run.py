#!/usr/bin/env python
"""Run the fault-injection suite once and print its report (exit 1 if an invariant broke).

    .venv/bin/python bench/chaos/run.py [--jobs 300] [--faults 30] [--seed 1] [--clusters 2]
                                        [--workers 2] [--seconds 40] [--keep]

A PostgreSQL of its own (initdb into a temporary folder, its own port), C real qclusters
(cluster 0 through a fault proxy; cluster 1 through a PgBouncer of its own in transaction
pooling with its clock 90 s ahead, and cluster 2 with its clock 90 s behind, both under Debian's
libfaketime), a real deduplicating HTTP receiver; jobs enqueued in waves over the
fault window; faults on the seed's schedule (bench/chaos/nemesis.py); then every fault healed,
the queue drained, the janitor run, and the checker (bench/chaos/checker.py) over the history,
the receiver's log, the database and the staging folder. Report: text on stdout, JSON beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.chaos import nemesis, pooler  # noqa: E402
from bench.chaos.clusters import Cluster  # noqa: E402
from bench.chaos.pgserver import PrivatePostgres  # noqa: E402

DATABASE = "chaos"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--faults", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--clusters", type=int, default=2)
    p.add_argument("--workers", type=int, default=2, help="django-q2 workers per cluster")
    p.add_argument("--seconds", type=float, default=40.0, help="the fault window")
    p.add_argument("--drain-seconds", type=float, default=180.0, help="deadline after it")
    p.add_argument("--kinds", default=",".join(nemesis.KINDS))
    p.add_argument("--output", type=Path, default=None, help="folder for the report and logs")
    p.add_argument("--keep", action="store_true", help="keep the private PostgreSQL's folder")
    p.add_argument("--read-only-through-pooler", action="store_true",
                   help="messy jobs on the PgBouncer cluster SET default_transaction_read_only "
                   "too (a known finding: docs/chaos.md)")  # fmt: skip
    return p.parse_args(argv)


def plan(rng: random.Random, rows: int) -> dict[str, Any]:
    drawn = _draw(rng, rows)
    if drawn["seconds"] and not drawn["items"]:  # a long job's loop creates and deletes a
        drawn["items"] = 1  # scratch row each round: where a zombie is most often stopped
    return drawn


def _draw(rng: random.Random, rows: int) -> dict[str, Any]:
    return {
        "stage": rng.random() < 0.5,
        "effect": rng.random() < 0.6,
        "rows": sorted(rng.sample(range(1, rows + 1), rng.randint(1, 2))),
        "seconds": round(rng.uniform(0.5, 3.0), 2) if rng.random() < 0.15 else 0,
        "fail_attempts": 1 if rng.random() < 0.1 else 0,
        "linger": round(rng.uniform(0.5, 1.5), 2) if rng.random() < 0.3 else 0,
        "mail": rng.random() < 0.3,
        "intent": rng.random() < 0.3,
        # Which receiver an effect / an intent goes to: prompt, slow, or hanging past the
        # caller's deadline after doing the work.
        "effect_target": rng.choices(TARGETS, TARGET_WEIGHTS)[0],
        "intent_target": rng.choices(TARGETS, TARGET_WEIGHTS)[0],
        # Items inserted and deleted through fenced_create / fenced_bulk_create / fenced_delete,
        # half of those jobs in one transaction (lingering inside it, if the job lingers).
        "items": rng.randint(1, 3) if rng.random() < ITEMS_SHARE else 0,
        "items_txn": rng.random() < 0.5,
        # A messy first attempt (jobs/worker/hygiene.py): a transaction left open, a session
        # parameter changed, or a thread left running.
        "mess": rng.choices(MESSES, MESS_WEIGHTS)[0],
    }


ITEMS_SHARE = 0.3
MESSES = ("", "atomic", "begin", "read_only", "thread")
MESS_WEIGHTS = (0.92, 0.02, 0.02, 0.02, 0.02)


TARGETS = ("prompt", "slow", "hang")
TARGET_WEIGHTS = (0.8, 0.15, 0.05)
SLOW_SECONDS = 0.5  # the slow receivers answer this late (within every caller's deadline)
HANG_SECONDS = 30.0  # the hanging ones: past the relay's 10 s and the handler's 2 s deadline


def enqueue_wave(plans: list[tuple[int, dict[str, Any]]]) -> int:
    """Enqueue these jobs, one transaction per wave, each with the unique key `chaos-<i>`.

    Exactly one job per key, whatever the outcome of a failed try: a unique key stops a second
    job only while the first is queued or running, so a try that failed at its COMMIT (its
    outcome unknown: it may have landed, and its jobs may have ended since) is not simply
    repeated -- the next try first looks for the wave's first key (the wave is all or nothing).
    """
    from django.db import DatabaseError, close_old_connections, transaction

    import jobs
    from jobs.models import Job

    if not plans:
        return 0
    for tries in range(50):
        try:
            close_old_connections()
            if tries and Job.objects.filter(unique_key=f"chaos-{plans[0][0]}").exists():
                return len(plans)  # an earlier try landed though its caller heard an error
            with transaction.atomic():
                for i, payload in plans:
                    jobs.enqueue("chaos.work", payload, unique_key=f"chaos-{i}")
            return len(plans)
        except DatabaseError:
            from django.db import connection

            connection.close()
            time.sleep(0.2)  # the database is down (a pg_crash): back off and try again
    raise RuntimeError("could not enqueue a wave after 50 tries")


def settled(world: nemesis.World, left_query: str, deadline: float) -> bool:
    """Poll until `left_query` counts nothing left, or `deadline` passes."""
    while time.monotonic() < deadline:
        try:
            if world.sql(left_query)[0][0] == 0:
                return True
        except Exception:  # noqa: BLE001 - the database may still be recovering
            pass
        time.sleep(0.25)
    return False


JOBS_LEFT = "SELECT count(*) FROM jobs_job WHERE state IN ('queued', 'running')"
# Every intent settled by the relay: done, or failed for an operator.
INTENTS_LEFT = "SELECT count(*) FROM jobs_intent WHERE state NOT IN ('done', 'failed')"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_at = datetime.now(UTC)
    out = args.output or Path(tempfile.mkdtemp(prefix="palisade-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    media, history_file = out / "media", out / "history.jsonl"
    rng = random.Random(args.seed)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    faults = nemesis.schedule(args.seed, args.faults, args.seconds, kinds, args.clusters,
                              args.workers)  # fmt: skip
    print(
        f"chaos: seed {args.seed}, {args.jobs} jobs, {len(faults)} faults over {args.seconds} s,"
        f" {args.clusters} clusters x {args.workers} workers; output {out}",
        flush=True,
    )
    pg = PrivatePostgres().init()
    pg.start()
    with ExitStack() as stack:
        stack.callback(lambda: pg.remove() if not args.keep else pg.stop())
        subprocess.run(["psql", pg.dsn(), "-q", "-c", f"CREATE DATABASE {DATABASE}"], check=True)
        os.environ.update({
            "DATABASE_URL": pg.dsn(DATABASE), "DJANGO_SETTINGS_MODULE": "bench.chaos.settings",
            "MEDIA_ROOT": str(media), "CHAOS_HISTORY": str(history_file),
            "JOBS_ORPHAN_GRACE_SECONDS": "0",
        })  # fmt: skip
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                       cwd=ROOT, check=True, env=os.environ)  # fmt: skip
        import django

        django.setup()
        from bench.chaos import evidence
        from bench.chaos.checker import check
        from bench.chaos.proxy import ChaosProxy
        from bench.chaos.workload.models import ChaosRow
        from tests.receiver import receiver
        from tests.slow_receivers import fencing_receiver
        from tests.smtp_receiver import smtp_server

        received = stack.enter_context(receiver())
        received_slow = stack.enter_context(receiver(delay=SLOW_SECONDS))
        received_hang = stack.enter_context(receiver(hang=HANG_SECONDS))
        fencing = stack.enter_context(fencing_receiver())
        fencing_slow = stack.enter_context(fencing_receiver(delay=SLOW_SECONDS))
        fencing_hang = stack.enter_context(fencing_receiver(hang=HANG_SECONDS))
        effect_receivers = (received, received_slow, received_hang)
        intent_receivers = {"prompt": fencing, "slow": fencing_slow, "hang": fencing_hang}
        mailbox = stack.enter_context(smtp_server())
        metric_start = evidence.rejected_metric()
        scraper = stack.enter_context(evidence.Scraper())
        rows = max(3, args.jobs // 10)
        ChaosRow.objects.bulk_create([ChaosRow(id=i) for i in range(1, rows + 1)])
        proxy = ChaosProxy("127.0.0.1", pg.port)
        stack.callback(proxy.close)
        bouncer = None
        if args.clusters > 1 and pooler.available():
            bouncer = pooler.PrivatePgBouncer(pg.port, DATABASE)
            stack.callback(bouncer.stop)
            bouncer.start()
        skews = ["", "+90s", "-90s"]
        clusters = []
        for n in range(args.clusters):
            env = {"JOBS_WORKERS": str(args.workers), "CHAOS_RECEIVER": received.url,
                   "CHAOS_RECEIVER_SLOW": received_slow.url,
                   "CHAOS_RECEIVER_HANG": received_hang.url,
                   "CHAOS_FENCING_RECEIVER": fencing.url, "CHAOS_FENCING_SLOW": fencing_slow.url,
                   "CHAOS_FENCING_HANG": fencing_hang.url, "CHAOS_SMTP_PORT": str(mailbox.port),
                   "JOBS_ORPHAN_GRACE_SECONDS": "0"}  # fmt: skip
            url = f"postgres://postgres@127.0.0.1:{pg.port}/{DATABASE}"
            if n == 0:  # through the fault proxy, which reads the commit's rows from its text:
                # a prepared statement's execution carries only its name and bound values
                url = f"postgres://postgres@127.0.0.1:{proxy.port}/{DATABASE}"
                env["JOBS_PREPARED_STATEMENTS"] = "0"
            elif n == 1 and bouncer is not None:  # through PgBouncer; LISTEN needs a session
                env["JOBS_LISTEN_URL"], url = url, bouncer.url()
                env["JOBS_PREPARED_STATEMENTS"] = "0"  # PgBouncer < 1.21 (docs/operations.md)
                env["CHAOS_POOLED"] = "1"
                if args.read_only_through_pooler:
                    env["CHAOS_READ_ONLY_THROUGH_POOLER"] = "1"
            cluster = Cluster(name=f"c{n}", database_url=url, env=env,
                              log=out / f"cluster-{n}.log",
                              skew=skews[n] if n < len(skews) else "")  # fmt: skip
            clusters.append(cluster)
            stack.callback(cluster.terminate)
        world = nemesis.World(pg=pg, database=DATABASE, clusters=clusters, proxy=proxy,
                              pooler=bouncer)  # fmt: skip
        plans = [(i, plan(rng, rows)) for i in range(args.jobs)]
        waves = max(1, int(args.seconds))
        per_wave = -(-len(plans) // waves)
        for cluster in clusters:
            cluster.start()
        t0 = time.monotonic()
        pending = list(faults)
        for w in range(waves):
            enqueue_wave(plans[w * per_wave : (w + 1) * per_wave])
            wave_end = t0 + (w + 1) * args.seconds / waves
            while pending and t0 + pending[0].at <= wave_end:
                fault = pending.pop(0)
                time.sleep(max(0.0, t0 + fault.at - time.monotonic()))  # the schedule's clock
                done = nemesis.inject(world, fault)
                what = json.dumps({k: v for k, v in done.items() if k not in ("kind", "wall")})
                print(f"  {fault.at:7.2f}s {fault.kind:26} {what}", flush=True)
            time.sleep(max(0.0, wave_end - time.monotonic()))
        for thread in world.pending:  # every zombie woken before the drain is judged
            thread.join()
        proxy.intercept(b"", None)  # disarm a held commit that never came
        for thread in world.pending:  # ... and every targeted fault still armed
            thread.join()
        proxy.heal()
        proxy.cut_on(b"\x00never\x00", after_reply=True)  # disarm a cut that never fired
        for cluster in clusters:  # a cluster stopped by a fault stays up from here on
            if cluster.proc is None or cluster.proc.poll() is not None:
                cluster.start()
        drain_ok = settled(world, JOBS_LEFT, time.monotonic() + args.drain_seconds)
        relay_ok = settled(world, INTENTS_LEFT, time.monotonic() + args.drain_seconds)
        from django.db import connection

        from jobs.effects import janitor

        # This process's own Django connection was opened before the faults: a pg_crash or a
        # terminate_backend late in the schedule leaves it broken without Django knowing (it
        # only learns on the next query, too late). The checks start on a new one.
        connection.close()
        orphans_found = _orphans_on_disk(world, media)
        removed = 0
        while swept := janitor.sweep("chaos-checker"):
            removed += swept
        stop_seconds = [round(c.terminate(killed=world.killed), 2) for c in clusters]
        scraper.__exit__()
        metric_delta = evidence.rejected_metric() - metric_start
        report = {
            "started_at": started_at.isoformat(),
            "config": {k: str(v) for k, v in vars(args).items()},
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "load": os.getloadavg(),
            },  # fmt: skip
            "commit": _commit(),
            "faults_by_kind": _by_kind(world.log),
            "faults_skipped": sum(1 for f in world.log if "skipped" in f),
            "zombies_taken_over": sum(1 for f in world.log if f.get("taken_over")),
            "pg_recoveries": world.recoveries,
            "faults_fired": _fired(world.log),
            "orphans_found_before_final_sweep": orphans_found,
            "orphans_removed_by_final_sweep": removed,
            "metric_scrapes": {"ok": scraper.scrapes, "failed": scraper.errors},
            "faults": world.log,
            "proxy": {"cuts": proxy.cuts, "resets": proxy.resets},
            "pooler_restarts": bouncer.restarts if bouncer else None,
            "drained": drain_ok,
            "cluster_stop_seconds": stop_seconds,
            **check(
                pg.dsn(DATABASE),
                history_file,
                [c for r in effect_receivers for c in r.calls],
                media,
                performs=[p for r in intent_receivers.values() for p in r.performed],
                mails=_mail_keys(mailbox.messages),
                logs=[c.log for c in clusters],
                killed=world.killed,
                metric_delta=metric_delta,
                lanes={name: r.url for name, r in intent_receivers.items()},
                faults=world.log,
                lease=world.lease,
                enqueued_keys=[f"chaos-{i}" for i, _ in plans],
            ),
            "receivers": {
                "effects_hung": received_hang.hung,
                "effects_slow": len(received_slow.calls),
                "intents_hung": fencing_hang.hung,
                "intents_slow": len(fencing_slow.performed),
            },  # fmt: skip
        }
        report["must_be_zero"]["jobs_not_drained_by_deadline"] = 0 if drain_ok else 1
        report["must_be_zero"]["intents_not_settled_by_deadline"] = 0 if relay_ok else 1
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        print_report(report, out)
        return 1 if any(report["must_be_zero"].values()) else 0


def _mail_keys(messages: list[bytes]) -> list[str]:
    from email import message_from_bytes

    # "<job>:<step>", whatever else a key carries (a key that wrongly held the attempt makes a
    # resent mail a duplicate the platform never recorded, not a missing one)
    keys = (str(message_from_bytes(m)["X-Idempotency-Key"]) for m in messages)
    return [":".join(k.split(":")[:2]) for k in keys]


def _fired(log: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per kind: faults scheduled, that hit something, and skipped (nothing to hit)."""
    out: dict[str, dict[str, int]] = {}
    for fault in log:
        entry = out.setdefault(fault["kind"], {"scheduled": 0, "fired": 0, "skipped": 0})
        entry["scheduled"] += 1
        hit = "skipped" not in fault and fault.get("fired", True) is not False
        entry["fired" if hit else "skipped"] += 1
    return out


def _orphans_on_disk(world: nemesis.World, media: Path) -> int:
    """Staged files not the committing attempt's, before the final janitor sweep."""
    committed = {(j, a) for j, a in world.sql(
        "SELECT id, attempt FROM jobs_job WHERE state = 'succeeded'")}  # fmt: skip
    found = 0
    for path in (media / "jobs").glob("*/attempt-*/*") if media.exists() else []:
        if (int(path.parts[-3]), int(path.parts[-2].split("-")[1])) not in committed:
            found += 1
    return found


def _by_kind(log: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for fault in log:
        counts[fault["kind"]] = counts.get(fault["kind"], 0) + 1
    return counts


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip()


def print_report(report: dict[str, Any], out: Path) -> None:
    print("\nchaos report")
    print(f"  faults: {report['faults_by_kind']} (skipped {report['faults_skipped']})")
    for kind, n in sorted(report["faults_fired"].items()):
        print(f"    {kind:26} scheduled {n['scheduled']:4}  fired {n['fired']:4}  "
              f"skipped {n['skipped']:4}")  # fmt: skip
    print(f"  zombies taken over: {report['zombies_taken_over']}; PostgreSQL recoveries "
          f"(s to accepting / to first commit): {report['pg_recoveries']}")  # fmt: skip
    print(f"  orphans on disk before the final sweep {report['orphans_found_before_final_sweep']}"
          f", removed by it {report['orphans_removed_by_final_sweep']}; receivers "
          f"{report['receivers']}; metric scrapes {report['metric_scrapes']}")  # fmt: skip
    for key, value in report["informational"].items():
        print(f"  {key}: {value}")
    print("  must be zero:")
    for key, value in report["must_be_zero"].items():
        print(f"    {'ok ' if value == 0 else 'BAD'} {key}: {value}")
    for key, examples in report["examples"].items():
        print(f"    e.g. {key}: {examples}")
    print(f"report: {out / 'report.json'}")


if __name__ == "__main__":
    raise SystemExit(main())
