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


def start_and_stop(db: Path, log: Path, port: int) -> str:
    """Run bin/run until its drill has ended, stop it, and return everything it printed."""
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
            while not DRILL_DONE.search(log.read_text(errors="replace")):
                assert proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)  # the poll interval of a deadline-bound wait
        finally:
            os.kill(proc.pid, signal.SIGTERM)  # bin/run's trap stops what it started
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything that outlived the deadline
            except ProcessLookupError:
                pass
    return log.read_text(errors="replace")


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
