"""`bin/run` itself, started twice on one SQLite file as a new user would: the demo is seeded
once, and its console prints a line for each failure, retry, rejected write and expiry the
database recorded, and none for a job that simply succeeded.

Each start runs to the end of its zombie drill (so no worker is left stopped), then gets SIGTERM
like a Ctrl-C; its process group is SIGKILLed if it outlives a deadline.
"""

import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.acceptance.cluster import PROJECT_DIR

pytestmark = [pytest.mark.acceptance, pytest.mark.timeout(300)]
SEEDED_KINDS = ("demo.sleep", "demo.flaky", "demo.render", "demo.report", "demo.noop")
DRILL_DONE = re.compile(r"was stopped past its lease|did not complete")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_and_stop(db: Path, log: Path, port: int, until: re.Pattern[str] = DRILL_DONE) -> str:
    """Run bin/run until its output matches `until` (by default: its drill has ended), stop it
    with SIGTERM, and return everything it printed. Fails if bin/run does not end within 60 s or
    leaves any process of its session behind."""
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in {"DATABASE_URL", "DJANGO_SETTINGS_MODULE"}
        },
        "PALISADE_SQLITE_PATH": str(db),
        "PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bin/run"],
            cwd=PROJECT_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 150
            while not until.search(log.read_text(errors="replace")):
                assert proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)  # the poll interval of a deadline-bound wait
        finally:
            os.kill(proc.pid, signal.SIGTERM)  # bin/run's trap stops what it started
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            left = session_processes(proc.pid)  # bin/run's session: all it started, and theirs
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything that outlived the deadline
            except ProcessLookupError:
                pass
        assert proc.returncode is not None, "bin/run outlived SIGTERM by 60 s"
        assert left == [], f"bin/run left processes running: {left}"
    return log.read_text(errors="replace")


def session_processes(sid: int) -> list[str]:
    """The processes of session `sid` still there (a zombie awaiting its reaper counts not)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{stat.parent.name} ({text[: text.rindex(')') + 1]}) {fields[0]}")
    return found


def rows(db: Path, sql: str, *params: object) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def test_bin_run_seeds_once_and_its_console_reports_every_failure_rejection_and_expiry(
    tmp_path: Path,
):
    db = tmp_path / "palisade.sqlite3"
    marks = ",".join("?" * len(SEEDED_KINDS))
    seeded = f"SELECT count(*) FROM jobs_job WHERE kind IN ({marks})"

    port = free_port()
    console = start_and_stop(db, tmp_path / "first.log", port)
    assert "was stopped past its lease" in console, console  # the drill staged its zombie
    # README: it "prints the URL of the live dashboard" (http://127.0.0.1:8000/ at PORT's default).
    assert f"Palisade is running: http://127.0.0.1:{port}/ " in console, console
    assert rows(db, seeded, *SEEDED_KINDS) == [(12,)]

    def lines(pattern: str) -> list[str]:
        return [line for line in console.splitlines() if re.search(pattern, line)]

    for job_id, kind in rows(db, "SELECT id, kind FROM jobs_job"):
        events = dict(
            rows(
                db,
                "SELECT type, count(*) FROM jobs_jobevent WHERE job_id = ? GROUP BY type",
                job_id,
            )
        )
        failures = events.get("retry_scheduled", 0) + events.get("failed", 0)
        assert len(lines(rf"\bjob {job_id} \({re.escape(kind)}\) attempt \d+ failed")) == failures
        assert len(lines(rf"lease reclaimed: job={job_id} ")) == events.get("expired", 0)
        assert len(lines(rf"rejected: job={job_id} ")) == events.get("rejected", 0)
        if set(events) == {"enqueued", "claimed", "succeeded"}:
            assert lines(rf"\bjob[ =]{job_id}\b") == [], f"a success was printed: job {job_id}"
    drill = rows(db, "SELECT id FROM jobs_job WHERE kind = 'demo.drill'")[0][0]
    assert lines(rf"rejected: job={drill} kind=\S+ attempt_presented=1 attempt_current=2")
    assert lines(rf"lease reclaimed: job={drill} kind=\S+ attempt=1 ")

    second = start_and_stop(db, tmp_path / "second.log", free_port())
    assert "demo jobs already seeded" in second, second
    assert rows(db, seeded, *SEEDED_KINDS) == [(12,)]  # a second start adds none


def test_stopping_bin_run_while_its_drill_holds_a_worker_stopped_leaves_nothing_behind(
    tmp_path: Path,
):
    """SIGTERM while the drill holds a worker SIGSTOPped: the drill resumes it and ends, then
    the rest stop; no process is left (the drill used to live on, orphaned, for its 90 s
    deadline while its worker stayed stopped until the cluster SIGKILLed it)."""
    stopped = re.compile(r"drill: job \d+ attempt 1, worker (\d+) stopped")
    console = start_and_stop(tmp_path / "db.sqlite3", tmp_path / "run.log", free_port(), stopped)
    match = stopped.search(console)
    assert match, console
    assert f"worker {match[1]} resumed" in console, console
    assert "drill interrupted by SIGTERM" in console, console
    assert "Traceback" not in console, console
    assert "killing [" not in console, console  # the cluster had no stopped worker to kill


def test_a_port_in_use_stops_bin_run_before_it_starts_anything(tmp_path: Path):
    """Another server on PORT: bin/run says so and starts nothing, instead of printing that
    server's URL as its dashboard and running a cluster and a drill without a web server."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env |= {"PALISADE_SQLITE_PATH": str(tmp_path / "db.sqlite3"), "PORT": str(port)}
        done = subprocess.run(
            ["bin/run"], cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 1, done
    assert f"port {port} is already in use" in done.stderr, done
    assert "Palisade is running" not in done.stdout, done
    assert not (tmp_path / "db.sqlite3").exists()  # not even migrated
