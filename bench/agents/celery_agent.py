"""Celery + Redis peer (runs inside the celery venv; imports nothing from Palisade).

    python celery_agent.py reset | enqueue N | enqueue-bulk N | status | latency GAPS_JSON
    celery -A celery_agent worker ...           (the worker, started by bench/systems/celery.py)

Celery stores nothing durable here (no result backend): the no-op task itself records its start
(first one only) and its completion time in Redis with one pipelined round trip, the completion
signal of this peer. Times are the host's wall clock (one machine).
"""

from __future__ import annotations

import json
import os
import sys
import time

import redis
from celery import Celery, group

URL = os.environ.get("BENCH_CELERY_REDIS", "redis://127.0.0.1:6379/14")
app = Celery("bench", broker=URL)
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="bench",
)
r = redis.Redis.from_url(URL)


@app.task(name="bench.noop")
def noop(sent: float | None = None) -> None:
    started = time.time()
    pipe = r.pipeline(transaction=False)
    pipe.setnx("bench:first_start", started)
    if sent is not None:
        pipe.rpush("bench:latency", started - sent)
    pipe.incr("bench:done")
    pipe.set("bench:last_finish", time.time())
    pipe.execute()


def main(argv: list[str]) -> None:
    cmd = argv[0]
    if cmd == "reset":
        r.flushdb()
        print(json.dumps({"ok": True}))
    elif cmd in ("enqueue", "enqueue-bulk"):
        n = int(argv[1])
        t0 = time.perf_counter()
        if cmd == "enqueue":
            for _ in range(n):
                noop.delay()
        else:
            group(noop.s() for _ in range(n)).apply_async()
        print(json.dumps({"n": n, "seconds": time.perf_counter() - t0}))
    elif cmd == "status":
        first, last, done = r.mget("bench:first_start", "bench:last_finish", "bench:done")
        print(
            json.dumps(
                {
                    "done": int(done or 0),
                    "first_start": float(first) if first else None,
                    "last_finish": float(last) if last else None,
                    "queued": r.llen("bench"),
                }
            )
        )
    elif cmd == "latency":
        samples = []
        for i, gap in enumerate(json.loads(argv[1])):
            time.sleep(gap)
            noop.delay(sent=time.time())
            deadline = time.monotonic() + 30
            while r.llen("bench:latency") < i + 1:
                if time.monotonic() > deadline:
                    raise SystemExit(f"latency sample {i} not started after 30 s")
                time.sleep(0.0005)
        samples = [float(x) * 1000 for x in r.lrange("bench:latency", 0, -1)]
        print(json.dumps({"enqueue_to_start_ms": samples}))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
