"""procrastinate peer (runs inside the procrastinate venv; imports nothing from Palisade).

    python procrastinate_agent.py enqueue N | enqueue-bulk N | latency GAPS_JSON
    procrastinate --app=procrastinate_agent.app worker ...   (started by bench/systems)

The task is an `async def` no-op (procrastinate's native kind). Its durable record is
procrastinate_events ('started', 'succeeded' with the database clock), read by the orchestrator.
"""

from __future__ import annotations

import json
import os
import sys
import time

import procrastinate
import psycopg

DSN = os.environ["BENCH_PROCRASTINATE_DSN"]
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN))


@app.task(name="noop", queue="bench")
async def noop() -> None:
    return None


def main(argv: list[str]) -> None:
    cmd = argv[0]
    with app.open():
        if cmd in ("enqueue", "enqueue-bulk"):
            n = int(argv[1])
            t0 = time.perf_counter()
            if cmd == "enqueue":
                for _ in range(n):
                    noop.defer()
            else:
                noop.batch_defer(*({} for _ in range(n)))
            print(json.dumps({"n": n, "seconds": time.perf_counter() - t0}))
        elif cmd == "latency":
            samples = []
            with psycopg.connect(DSN, autocommit=True) as conn:
                for gap in json.loads(argv[1]):
                    time.sleep(gap)
                    job_id = noop.defer()
                    deadline = time.monotonic() + 30
                    while True:
                        row = conn.execute(
                            "SELECT s.at - d.at FROM procrastinate_events d "
                            "JOIN procrastinate_events s ON s.job_id = d.job_id "
                            "AND s.type = 'started' WHERE d.job_id = %s AND d.type = 'deferred'",
                            (job_id,),
                        ).fetchone()
                        if row:
                            samples.append(row[0].total_seconds() * 1000)
                            break
                        if time.monotonic() > deadline:
                            raise SystemExit(f"job {job_id} not started after 30 s")
                        time.sleep(0.0005)
            print(json.dumps({"enqueue_to_start_ms": samples}))
        else:
            raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
