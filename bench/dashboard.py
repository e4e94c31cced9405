#!/usr/bin/env python
"""The live dashboard's benchmark: server time at a million jobs (every screen and every jobs-list
filter, matching or not), commit -> browser latency with and without 12 narrow-filter sockets
open, and what open dashboards (five screens, or the 12 narrow sockets) cost the workers' drain.

    .venv/bin/python bench/dashboard.py [--rows 1000000] [--samples 200] [--latency 100]
                                        [--drain-jobs 4000] [--repeat 3] [--narrow 12]
                                        [--drain-with narrow|five] [--db NAME] [--reuse]
                                        [--phases server,latency,drain] [--only WORDS]
                                        [--ab OTHER_CHECKOUT]

Phases, against a fresh database `palisade_bench_dash` (--db; dropped, recreated, migrated --
or, with --reuse, the one a previous run seeded):

  seed     --rows jobs inserted by SQL (kinds, queues, states, payloads, every tenth keyed), one
           attempt and two events per finished job, plus one job with 50 attempts, 5,000 events
           and 49 rejected writes; 20 cron schedules with 2,500 finished runs each (the cron
           page; added to a reused database that lacks them); VACUUM ANALYZE.
  server   in-process Django test client, logged in: each URL --samples times after a warm-up
           (--only 'payload text,50 attempts': only the screens whose label holds one of these);
           the time of `client.get` (routing, queries, template rendering) -- "server time" --
           and this process's CPU time in it (Python's share: the database's is not in it, and
           it depends far less on what else runs on the machine than the wall time does).
           EXPLAIN of the list queries goes into the JSON. With --ab DIR, the same screens are
           served by this checkout and by DIR (say, `git archive` of the commit before a
           change, with this file copied in) in two processes, one request each in turn: a
           before/after on a shared machine where both sides meet the same load.
  latency  uvicorn (the production server, config.websocket's protocol) + Debian chromium
           (Playwright) showing the jobs list's first page; Python
           enqueues one job at a time (a transition writing an event) and notes the wall clock
           after COMMIT; the page notes the wall clock after applying the push that carries an
           event id >= that event's ("palisade:applied"). Same machine, same clock. Measured
           alone, then with --narrow websockets (opened by one more page) showing jobs-list
           first pages filtered to nothing (`kind=nope`, `until=2000-01-01`, ...) -- the
           hostile reader of issue 18.
  drain    --drain-jobs demo.noop jobs drained by `manage.py qcluster` (2 workers, batch 8)
           with no dashboard open, then with the --narrow sockets open (--drain-with narrow) or
           five screens (overview, jobs, a job, rejected, workers) -- alternating, --repeat
           times each; rate = N / (last finish - first claim), database clock. Browsers,
           the web server and the workers share the two cores.

The load average at each phase goes into the JSON: on a shared machine, read the figures beside it.

Results: bench/results/dashboard-<timestamp>.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(ROOT))

from bench.protocol import RESULTS_DIR, median, spawn, stop, stop_all, summarize  # noqa: E402

# A measurement never reads a developer's .env (bin/setup --dev): DEBUG there logs every query.
os.environ.setdefault("PALISADE_ENV_FILE", "none")

SERVER = "postgres://postgres@127.0.0.1:5432"
DB_NAME = "palisade_bench_dash"
DB_URL = f"{SERVER}/{DB_NAME}"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

NARROW_FILTERS = [
    "kind=nope", "queue=nope", "state=cancelled", "until=2000-01-01T00:00",
    "since=2999-01-01T00:00", "kind=nope&queue=mail", "kind=demo.flaky&queue=nope",
    "state=cancelled&kind=demo.noop", "queue=reports&until=2000-01-01T00:00",
    "kind=mail.send&state=cancelled", "queue=nope&state=failed", "kind=report.render&queue=nope",
]  # fmt: skip

ENV = {
    **os.environ,
    "DJANGO_SETTINGS_MODULE": "config.settings",
    "DATABASE_URL": DB_URL,
    "SECRET_KEY": os.environ.get("SECRET_KEY", "palisade-bench-only"),  # DEBUG is off
    "JOBS_WORKERS": "2",
    "PYTHONUNBUFFERED": "1",
    "ALLOWED_HOSTS": "testserver,localhost,127.0.0.1",
}
ENV.pop("REDIS_URL", None)

SEED_JOBS = """
INSERT INTO jobs_job (kind, payload, queue, priority, state, attempt, run_at, created_at,
                      updated_at, finished_at, unique_key, result, result_ref, error)
SELECT (ARRAY['demo.noop','demo.sleep','demo.flaky','report.render','mail.send'])[1 + i %% 5],
       jsonb_build_object('customer', 'cust-' || (i %% 5000), 'order', i, 'note', md5(i::text)),
       (ARRAY['default','mail','reports'])[1 + i %% 3], 0,
       CASE WHEN i %% 97 = 0 THEN 'failed' ELSE 'succeeded' END, 1,
       t, t, t + interval '1 second', t + interval '1 second',
       CASE WHEN i %% 10 = 0 THEN 'key-' || i END, '{"ok": true}', '', ''
  FROM (SELECT i, now() - make_interval(secs => (%(n)s - i) * 0.05) AS t
          FROM generate_series(1, %(n)s) AS i) s
"""
SEED_ATTEMPTS = """
INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, heartbeat_at, ended_at, outcome,
                          staging_ref, error)
SELECT id, 1, 'bench-host:' || (id % 4), created_at, created_at, finished_at, state, '', ''
  FROM jobs_job
"""
SEED_EVENTS = """
INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
SELECT id, 1, e.type, 'bench-host:' || (id % 4), CASE e.type WHEN 'claimed' THEN created_at
       ELSE finished_at END, '{}'
  FROM jobs_job, (VALUES ('claimed'), ('succeeded')) AS e(type) ORDER BY id
"""


SCHEDULES = 20
RUNS_PER_SCHEDULE = 2_500
SEED_SCHEDULES = """
INSERT INTO jobs_schedule (name, kind, cron, timezone, payload, queue, missed, enabled, next_at,
                           last_tick_at, ticks_enqueued, ticks_skipped, source, updated_at)
SELECT 'bench-' || lpad(s::text, 2, '0'), 'report.render', '*/5 * * * *', 'Europe/Paris', '{}',
       'reports', 'latest', true, now() + interval '5 minutes', now(), %(runs)s, 0, 'bench', now()
  FROM generate_series(1, %(n)s) s
"""
SEED_SCHEDULE_JOBS = """
INSERT INTO jobs_job (kind, payload, queue, priority, state, attempt, run_at, created_at,
                      updated_at, finished_at, unique_key, result, result_ref, error)
SELECT 'report.render', jsonb_build_object('customer', 'cust-' || (k %% 5000), 'order', k,
       'note', md5(name || k)), 'reports', 0, 'succeeded', 1, t, t, t + interval '2 seconds',
       t + interval '2 seconds', 'schedule:' || name || ':' || to_char(t, 'YYYY-MM-DD"T"HH24:MI'),
       '{}', '', ''
  FROM jobs_schedule, LATERAL (SELECT k, now() - make_interval(mins => 5 * k) AS t
                                 FROM generate_series(1, %(runs)s) k) ticks
 WHERE source = 'bench'
 ORDER BY t
"""


def seed_schedules(conn: psycopg.Connection[Any]) -> None:
    """SCHEDULES cron schedules with RUNS_PER_SCHEDULE finished runs each (the cron page's
    rows), once per database: a reused database seeded before they existed gets them too."""
    if conn.execute("SELECT 1 FROM jobs_schedule WHERE source = 'bench' LIMIT 1").fetchone():
        return
    log(f"seeding {SCHEDULES} schedules with {RUNS_PER_SCHEDULE:,} runs each")
    conn.execute(SEED_SCHEDULES, {"n": SCHEDULES, "runs": RUNS_PER_SCHEDULE})
    floor = conn.execute("SELECT max(id) FROM jobs_job").fetchone()[0]
    conn.execute(SEED_SCHEDULE_JOBS, {"runs": RUNS_PER_SCHEDULE})
    conn.execute(
        "INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, heartbeat_at, ended_at, "
        "outcome, staging_ref, error) SELECT id, 1, 'bench-host:1', created_at, created_at, "
        "finished_at, state, '', '' FROM jobs_job WHERE id > %s",
        (floor,),
    )
    for table in ("jobs_job", "jobs_attempt", "jobs_schedule"):
        conn.execute(f"VACUUM ANALYZE {table}")


def log(message: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {message}", flush=True)


def create_database() -> psycopg.Connection[Any]:
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DB_NAME}")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT, env=ENV, check=True, timeout=300,
    )  # fmt: skip
    return psycopg.connect(DB_URL, autocommit=True)


def seed(conn: psycopg.Connection[Any], rows: int) -> int:
    """Insert `rows` finished jobs and one big job; returns the big job's id."""
    conn.execute(SEED_JOBS, {"n": rows})
    conn.execute(SEED_ATTEMPTS)
    conn.execute(SEED_EVENTS)
    big = conn.execute(
        "INSERT INTO jobs_job (kind, payload, state, attempt, finished_at, result_ref, error) "
        "VALUES ('report.render', '{\"big\": true}', 'succeeded', 50, now(), '', '') RETURNING id"
    ).fetchone()[0]
    conn.execute(
        """
        INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, heartbeat_at, ended_at,
                                  outcome, staging_ref, error)
        SELECT %(id)s, n, 'bench-host:' || n, now() - make_interval(secs => 600 - n * 10),
               now() - make_interval(secs => 595 - n * 10),
               now() - make_interval(secs => 592 - n * 10),
               CASE WHEN n = 50 THEN 'succeeded' ELSE 'expired' END, '', ''
          FROM generate_series(1, 50) n
        """,
        {"id": big},
    )
    conn.execute(
        """
        INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
        SELECT %(id)s, 1 + i / 100,
               CASE i %% 100 WHEN 0 THEN 'claimed' WHEN 99 THEN 'expired' ELSE 'heartbeat' END,
               'w', now() - make_interval(secs => 600 - i * 0.1), '{}'
          FROM generate_series(0, 4999) i
        """,
        {"id": big},
    )
    conn.execute(
        """
        INSERT INTO jobs_rejectedwrite (job_id, attempt_presented, attempt_current, state_current,
                                        worker, write, at)
        SELECT %(id)s, n, n + 1, 'running', 'bench-host:' || n, 'commit',
               now() - make_interval(secs => 590 - n * 10)
          FROM generate_series(1, 49) n
        """,
        {"id": big},
    )
    for table in ("jobs_job", "jobs_attempt", "jobs_jobevent", "jobs_rejectedwrite"):
        conn.execute(f"VACUUM ANALYZE {table}")
    return int(big)


def setup_django() -> None:
    os.environ.update(
        {
            k: v
            for k, v in ENV.items()
            if k in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "ALLOWED_HOSTS"}
        }
    )
    import django

    django.setup()


def superuser() -> Any:
    from django.contrib.auth.models import User

    user = User.objects.filter(username="bench").first()
    return user or User.objects.create_superuser("bench", "bench@example.com", "bench")


def screen_urls(big: int, rows: int, only: str = "") -> dict[str, str]:
    """Every screen the server phase times, by label (--only: those whose label holds a word)."""
    mid = rows // 2
    urls = {
        "jobs list, first page": "/jobs/",
        "jobs list, keyset page in the middle": f"/jobs/?before={mid}",
        "jobs list, state=failed": "/jobs/?state=failed",
        "jobs list, kind + queue": "/jobs/?kind=demo.flaky&queue=mail",
        "jobs list, kind=demo.noop": "/jobs/?kind=demo.noop",
        "jobs list, queue=reports": "/jobs/?queue=reports",
        "jobs list, since an hour ago": "/jobs/?since="
        + (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
        "jobs list, until the middle": "/jobs/?until="
        + (datetime.now(UTC) - timedelta(seconds=rows * 0.025)).strftime("%Y-%m-%dT%H:%M"),
        **{f"jobs list, nothing: {q}": f"/jobs/?{q}" for q in NARROW_FILTERS},
        "jobs list, search by id": f"/jobs/?q={mid}",
        "jobs list, search by unique key": f"/jobs/?q=key-{mid - mid % 10}",
        "jobs list, payload text search": f"/jobs/?q=cust-{rows % 5000 - 7}",
        "jobs list, payload JSON search": '/jobs/?q={"customer": "cust-42"}',
        "job page (1 attempt)": f"/jobs/{mid}/",
        "job page (50 attempts, 5,000 events)": f"/jobs/{big}/",
        "rejected feed": "/rejected/",
        "workers": "/workers/",
        "overview": "/",
        "queues": "/queues/",
        "cron": "/cron/",
    }
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        urls = {k: v for k, v in urls.items() if any(w in k for w in wanted)}
    return urls


def server_times(big: int, rows: int, samples: int, only: str = "") -> dict[str, Any]:
    from django.db import connection
    from django.test import Client

    from dashboard import selectors

    client = Client()
    client.force_login(superuser())
    urls = screen_urls(big, rows, only)
    results: dict[str, Any] = {}
    for label, url in urls.items():
        for _ in range(5):
            assert client.get(url).status_code == 200, url
        times, cpu = [], []
        for _ in range(samples):
            t, c = time.perf_counter(), time.process_time()
            client.get(url)
            times.append((time.perf_counter() - t) * 1000)
            cpu.append((time.process_time() - c) * 1000)
        results[label] = {"url": url, **summarize(times), "cpu": summarize(cpu)}
        log(
            f"{label:42s} p50 {results[label]['p50']:7.1f} ms  p95 {results[label]['p95']:7.1f} ms"
            f"  (Python CPU p50 {results[label]['cpu']['p50']:5.1f} ms)"
        )
    with connection.cursor() as cur:
        plans = {}
        for label, filters in {
            "first page": {},
            "payload text": {"q": "cust-7"},
            "unique key": {"q": "key-500"},
        }.items():
            qs = (
                selectors._search(selectors.Job.objects.all(), filters["q"])
                if filters
                else (selectors.Job.objects.all())
            )
            sql, params = qs.order_by("-id")[:51].query.sql_with_params()
            cur.execute(f"EXPLAIN {sql}", params)
            plans[label] = [r[0] for r in cur.fetchall()]
    return {"urls": results, "explain": plans}


def serve_requests() -> None:
    """--serve: time one GET per URL read from stdin, answer "<wall ms> <cpu ms>" (--ab's child)."""
    from django.test import Client

    client = Client()
    client.force_login(superuser())
    for line in sys.stdin:
        url = line.strip()
        t, c = time.perf_counter(), time.process_time()
        status = client.get(url).status_code
        wall, cpu = (time.perf_counter() - t) * 1000, (time.process_time() - c) * 1000
        print(f"{wall:.3f} {cpu:.3f}" if status == 200 else f"error {status}", flush=True)


def ab_times(other: Path, big: int, rows: int, samples: int, only: str) -> dict[str, Any]:
    """--ab DIR: the same screens served by this checkout and by DIR (another checkout of the
    project, e.g. the commit before a change, holding this file too), one request each in
    turn, the order swapped every pair, so both see the same moments of a shared machine."""
    sides = {"this": ROOT, "other": other.resolve()}
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(root / "bench" / "dashboard.py"), "--db", DB_NAME, "--serve"],
            cwd=root, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for name, root in sides.items()
    }  # fmt: skip

    def one(name: str, url: str) -> tuple[float, float]:
        proc = procs[name]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(url + "\n")
        proc.stdin.flush()
        answer = proc.stdout.readline().split()
        if len(answer) != 2 or answer[0] == "error":
            raise RuntimeError(f"{name} {url}: {answer}")
        return float(answer[0]), float(answer[1])

    results: dict[str, Any] = {"other": str(sides["other"])}
    try:
        for label, url in screen_urls(big, rows, only).items():
            for _ in range(5):
                one("this", url), one("other", url)
            got: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in procs}
            for i in range(samples):
                for name in ("this", "other") if i % 2 == 0 else ("other", "this"):
                    wall, cpu = one(name, url)
                    got[name][0].append(wall)
                    got[name][1].append(cpu)
            results[label] = {
                n: {"url": url, **summarize(w), "cpu": summarize(c)} for n, (w, c) in got.items()
            }
            this, that = results[label]["this"], results[label]["other"]
            log(
                f"{label:38s} this p50 {this['p50']:6.1f} p95 {this['p95']:6.1f} cpu "
                f"{this['cpu']['p50']:5.1f} | other p50 {that['p50']:6.1f} p95 {that['p95']:6.1f} "
                f"cpu {that['cpu']['p50']:5.1f} ms | load {os.getloadavg()[0]:.1f}"
            )
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=30)
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    """The production web server (docs/operations.md): uvicorn with config.websocket's protocol."""
    port = _free_port()
    env = {**ENV, "DJANGO_DEBUG": "1"}
    proc = spawn(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--lifespan", "off", "--no-access-log",
         "--ws", "config.websocket:BoundedWebSocketProtocol"],
        env, RESULTS_DIR / "logs" / "dashboard-uvicorn.log",
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    raise RuntimeError("uvicorn did not start")


def open_pages(browser: Any, base: str, paths: list[str]) -> list[Any]:
    from django.test import Client

    client = Client()
    client.force_login(superuser())
    context = browser.new_context()
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base}]
    )
    pages = []
    for path in paths:
        page = context.new_page()
        page.add_init_script(
            "window.__applied = [];"
            "document.addEventListener('palisade:applied', e => window.__applied.push("
            "[e.detail.lastEventId, Date.now(), e.detail.swaps]));"
        )
        page.goto(base + path)
        page.wait_for_function("document.getElementById('live-status').textContent === 'live'")
        pages.append(page)
    return pages


def open_narrow(browser: Any, base: str, count: int) -> Any:
    """One page holding `count` websockets, each a jobs-list first page filtered to nothing."""
    from dashboard import selectors

    (page,) = open_pages(browser, base, ["/jobs/?kind=nope"])
    page.evaluate(
        """([n, queries, since]) => { window.__narrow = []; window.__narrowPushes = 0;
          for (let i = 0; i < n; i++) {
            const q = new URLSearchParams({page: "jobs", query: queries[i % queries.length],
                                           first: "1", since: since});
            const ws = new WebSocket("ws://" + location.host + "/ws/live/?" + q);
            ws.onmessage = () => { window.__narrowPushes += 1; };
            window.__narrow.push(ws);
          } }""",
        [count, NARROW_FILTERS, selectors.latest_event_id()],
    )
    page.wait_for_function(f"window.__narrow.filter(w => w.readyState === 1).length === {count}")
    return page


def latency(browser: Any, base: str, samples: int, narrow: int = 0) -> dict[str, Any]:
    """Commit of an enqueue -> the jobs list page has applied the push carrying its event."""
    from django.db import transaction

    import jobs
    from jobs.models import JobEvent

    hostile = open_narrow(browser, base, narrow) if narrow else None
    (page,) = open_pages(browser, base, ["/jobs/"])
    rng = random.Random(7)
    marks: list[tuple[int, float]] = []
    for _ in range(samples):
        with transaction.atomic():
            job = jobs.enqueue("demo.noop", {"bench": "latency"})
        committed = time.time() * 1000
        event_id = JobEvent.objects.filter(job=job).values_list("id", flat=True).first()
        marks.append((int(event_id or 0), committed))
        page.wait_for_timeout(rng.uniform(250, 400))  # gap between samples (lets pushes drain)
    applied = page.evaluate("window.__applied")
    lat = []
    for event_id, committed in marks:
        arrival = next((t for eid, t, swaps in applied if eid >= event_id and swaps), None)
        if arrival is not None:
            lat.append(arrival - committed)
    page.context.close()
    out = {"samples": len(marks), "matched": len(lat), "narrow_sockets": narrow, **summarize(lat)}
    if hostile is not None:
        out["narrow_messages"] = hostile.evaluate("window.__narrowPushes")
        hostile.context.close()
    return out | {"loadavg": os.getloadavg()}


def drain_once(conn: psycopg.Connection[Any], n: int, label: str) -> float:
    floor = conn.execute("SELECT COALESCE(max(id), 0) FROM jobs_job").fetchone()[0]
    conn.execute(
        "INSERT INTO jobs_job (kind, payload, result_ref, error) "
        "SELECT 'demo.noop', '{\"drain\": true}', '', '' FROM generate_series(1, %s)",
        (n,),
    )
    conn.execute("VACUUM ANALYZE jobs_job")
    conn.execute("CHECKPOINT")
    env = {**ENV, "JOBS_CLAIM_BATCH": "8"}
    proc = spawn(
        [sys.executable, "manage.py", "qcluster"],
        env,
        RESULTS_DIR / "logs" / f"dashboard-drain-{label}.log",
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            done = conn.execute(
                "SELECT count(*) FROM jobs_job WHERE id > %s AND state = 'succeeded'", (floor,)
            ).fetchone()[0]
            if done >= n:
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"drain {label}: {done}/{n}")
            time.sleep(0.05)
        first, last = conn.execute(
            "SELECT min(a.claimed_at), max(j.finished_at) FROM jobs_job j "
            "JOIN jobs_attempt a ON a.job_id = j.id WHERE j.id > %s",
            (floor,),
        ).fetchone()
    finally:
        stop(proc)
    return n / (last - first).total_seconds()


def drains(
    conn: psycopg.Connection[Any],
    browser: Any,
    base: str,
    n: int,
    repeat: int,
    big: int,
    narrow: int,
    kind: str,
) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"none": [], kind: []}
    for rep in range(repeat):
        rates["none"].append(drain_once(conn, n, f"none-{rep}"))
        if kind == "narrow":
            pages = [open_narrow(browser, base, narrow)]
        else:
            pages = open_pages(
                browser, base, ["/", "/jobs/", f"/jobs/{big}/", "/rejected/", "/workers/"]
            )
        pages[0].wait_for_timeout(2000)  # let the initial page loads finish first
        rates[kind].append(drain_once(conn, n, f"{kind}-{rep}"))
        pushes = sum(len(p.evaluate("window.__applied")) for p in pages)
        if kind == "narrow":
            pushes = pages[0].evaluate("window.__narrowPushes")
        pages[0].context.close()
        log(
            f"drain rep {rep + 1}: no dashboard {rates['none'][-1]:.0f}/s, {kind} "
            f"{rates[kind][-1]:.0f}/s ({pushes} messages) load {os.getloadavg()[0]:.1f}"
        )
    return {
        "jobs": n,
        "runs": rates,
        "with": kind,
        "narrow_sockets": narrow if kind == "narrow" else 0,
        "median_none": median(rates["none"]),
        "median_with": median(rates[kind]),
        "loadavg": os.getloadavg(),
    }


def use_database(name: str) -> None:
    global DB_NAME, DB_URL
    DB_NAME, DB_URL = name, f"{SERVER}/{name}"
    ENV["DATABASE_URL"] = DB_URL


def reuse(rows: int) -> tuple[psycopg.Connection[Any], int] | None:
    """The database a previous run seeded with `rows` jobs (migrated again), or None."""
    try:
        conn = psycopg.connect(DB_URL, autocommit=True)
    except psycopg.OperationalError:
        return None
    found = conn.execute(
        "SELECT (SELECT count(*) FROM jobs_job WHERE kind <> 'demo.noop' OR payload ? 'order'), "
        "(SELECT id FROM jobs_job WHERE attempt = 50 LIMIT 1)"
    ).fetchone()
    if not found or found[0] < rows or found[1] is None:
        conn.close()
        return None
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT, env=ENV, check=True, timeout=600,
    )  # fmt: skip
    return conn, int(found[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--latency", type=int, default=100)
    parser.add_argument("--drain-jobs", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--narrow", type=int, default=12)
    parser.add_argument("--drain-with", choices=["narrow", "five"], default="narrow")
    parser.add_argument("--db", default=DB_NAME)
    parser.add_argument("--reuse", action="store_true", help="keep a database already seeded")
    parser.add_argument("--phases", default="server,latency,drain")
    parser.add_argument(
        "--ab",
        type=Path,
        help="server phase against another checkout too (e.g. the commit before a change), "
        "one request each in turn",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--only",
        default="",
        help="server phase: only the screens whose label contains one of "
        "these comma-separated words (e.g. 'payload text,50 attempts,queues,cron')",
    )
    args = parser.parse_args()
    phases = set(args.phases.split(","))
    use_database(args.db)
    if args.serve:
        setup_django()
        serve_requests()
        return 0
    (RESULTS_DIR / "logs").mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM calls beside Playwright's event loop
    found = reuse(args.rows) if args.reuse else None
    if found:
        conn, big = found
        log(f"reusing {DB_NAME}")
    else:
        conn = create_database()
        log(f"seeding {args.rows:,} jobs")
        big = seed(conn, args.rows)
    seed_schedules(conn)
    setup_django()
    out: dict[str, Any] = {"rows": args.rows, "started": datetime.now(UTC).isoformat()}
    out["loadavg_at_start"] = os.getloadavg()
    if "server" in phases and args.ab:
        out["server_ab"] = ab_times(args.ab, big, args.rows, args.samples, args.only)
    elif "server" in phases:
        out["server"] = server_times(big, args.rows, args.samples, args.only)
    if not phases & {"latency", "drain"}:
        stop_all()
        path = RESULTS_DIR / f"dashboard-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
        path.write_text(json.dumps(out, indent=2, default=str))
        log(f"results: {path}")
        return 0
    proc, base = start_server()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            if "latency" in phases:
                out["latency"] = latency(browser, base, args.latency)
                log(f"commit -> browser: {out['latency']}")
                if args.narrow:
                    out["latency_narrow"] = latency(browser, base, args.latency, args.narrow)
                    log(f"commit -> browser, {args.narrow} narrow: {out['latency_narrow']}")
            if "drain" in phases:
                out["drain"] = drains(
                    conn, browser, base, args.drain_jobs, args.repeat, big, args.narrow,
                    args.drain_with,
                )  # fmt: skip
                d = out["drain"]
                log(
                    f"drain medians: no dashboard {d['median_none']:.0f}/s, "
                    f"{d['with']} {d['median_with']:.0f}/s"
                )
            browser.close()
    finally:
        stop(proc)
        stop_all()
    path = RESULTS_DIR / f"dashboard-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(out, indent=2, default=str))
    log(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
