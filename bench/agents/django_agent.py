"""Agent for the Django-based peers (runs inside the peer's venv; imports nothing from Palisade).

    BENCH_PEER=dtdb|djq-orm|djq-redis BENCH_DSN=postgres://... python django_agent.py CMD ...

    migrate | reset | enqueue N | enqueue-bulk N | status | latency GAPS_JSON

Workers: `python -m django db_worker ...` (django-tasks-db), `python -m django qcluster`
(django-q2), started by bench/systems/django_peers.py with this directory on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "peer_settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

PEER = os.environ.get("BENCH_PEER", "dtdb")
LAST_STARTED_DTDB = """
SELECT extract(epoch FROM started_at) FROM django_tasks_database_dbtaskresult
 WHERE started_at IS NOT NULL ORDER BY enqueued_at DESC LIMIT 1
"""


def db_now() -> float:
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM clock_timestamp())")
        return float(cur.fetchone()[0])


def enqueue_one(**kwargs: object) -> None:
    if PEER == "dtdb":
        from peer_tasks import noop

        noop.enqueue()
    else:
        from django_q.tasks import async_task

        async_task("math.floor", 1, **kwargs)


def status() -> dict:
    with connection.cursor() as cur:
        if PEER == "dtdb":
            cur.execute(
                "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
                "count(*) FILTER (WHERE status = 'FAILED'), "
                "extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)), "
                "extract(epoch FROM min(finished_at)) FROM django_tasks_database_dbtaskresult"
            )
        else:
            cur.execute(
                # django-q2 records no start: `started` is set by async_task at enqueue. The
                # first finish stands in for the first start (the orchestrator then counts N-1)
                "SELECT count(*) FILTER (WHERE success), count(*) FILTER (WHERE NOT success), "
                "extract(epoch FROM min(stopped)), extract(epoch FROM max(stopped)), "
                "extract(epoch FROM min(stopped)) FROM django_q_task"
            )
        done, bad, first_start, last_finish, first_finish = cur.fetchone()
    return {
        "done": done,
        "bad": bad,
        "first_start": float(first_start) if first_start is not None else None,
        "last_finish": float(last_finish) if last_finish is not None else None,
        "first_finish": float(first_finish) if first_finish is not None else None,
        "db_now": db_now(),
    }


def reset() -> None:
    with connection.cursor() as cur:
        if PEER == "dtdb":
            cur.execute("TRUNCATE django_tasks_database_dbtaskresult")
        else:
            cur.execute("TRUNCATE django_q_task, django_q_ormq")
    if PEER == "djq-redis":
        import redis

        redis.Redis.from_url(
            os.environ.get("BENCH_DJQ_REDIS", "redis://127.0.0.1:6379/13")
        ).flushdb()


def latency(gaps: list[float]) -> list[float]:
    samples = []
    with connection.cursor() as cur:
        for gap in gaps:
            time.sleep(gap)
            sent = time.time()
            enqueue_one()
            deadline = time.monotonic() + 30
            while True:
                if PEER == "dtdb":
                    cur.execute(LAST_STARTED_DTDB)
                    row = cur.fetchone()
                    if row and row[0] is not None and float(row[0]) >= sent:
                        samples.append((float(row[0]) - sent) * 1000)
                        break
                else:
                    # django-q2 records no start (`started` is the enqueue time): its sample is
                    # enqueue -> `stopped`, an upper bound for a no-op
                    cur.execute(
                        "SELECT extract(epoch FROM stopped) FROM django_q_task "
                        "ORDER BY stopped DESC LIMIT 1"
                    )
                    row = cur.fetchone()
                    if row and float(row[0]) >= sent:
                        samples.append((float(row[0]) - sent) * 1000)
                        break
                if time.monotonic() > deadline:
                    raise SystemExit("latency sample not started after 30 s")
                time.sleep(0.0005)
    return samples


def main(argv: list[str]) -> None:
    cmd = argv[0]
    if cmd == "migrate":
        call_command("migrate", verbosity=0, interactive=False)
        print(json.dumps({"ok": True}))
    elif cmd == "reset":
        reset()
        print(json.dumps({"ok": True}))
    elif cmd in ("enqueue", "enqueue-bulk"):
        n = int(argv[1])
        t0 = time.perf_counter()
        if cmd == "enqueue":
            for _ in range(n):
                enqueue_one()
        else:
            # neither peer has a bulk API: N enqueues in one transaction (the Redis broker of
            # django-q2 is not transactional, so that is N round trips to Redis)
            with transaction.atomic():
                for _ in range(n):
                    enqueue_one()
        print(json.dumps({"n": n, "seconds": time.perf_counter() - t0}))
    elif cmd == "status":
        print(json.dumps(status()))
    elif cmd == "latency":
        print(json.dumps({"enqueue_to_start_ms": latency(json.loads(argv[1]))}))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
