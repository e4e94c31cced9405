"""Bulk operator actions: a keyset cursor that reaches every matching job, and an audit written
with each chunk, so an interrupted run (SIGINT to `manage.py jobs`) leaves every change audited."""

import os
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command

from jobs.core import transitions
from jobs.core.states import JobState
from jobs.models import Job
from jobs.ops import actions
from tests.acceptance.cluster import PROJECT_DIR, subprocess_database_env

CHUNK = getattr(actions, "CHUNK_ROWS", 500)


def run(*args: str) -> str:
    out = StringIO()
    call_command("jobs", *args, stdout=out)
    return out.getvalue()


def audited_ids() -> set[int]:
    entries = LogEntry.objects.filter(action_flag=CHANGE)
    return {int(i) for i in entries.values_list("object_id", flat=True)}


def cancelled_ids() -> set[int]:
    return set(Job.objects.filter(state=JobState.CANCELLED).values_list("id", flat=True))


@pytest.mark.django_db
def test_the_cli_reaches_every_matching_job_past_the_old_cap(make_job, monkeypatch):
    """The filter (kind) still matches the jobs it cancelled: a capped run used to take the same
    oldest ids again. Without --limit the CLI walks every matching job, chunk by chunk."""
    User.objects.create_superuser("root", password="pw")
    monkeypatch.setattr(actions, "MAX_ROWS", 3)
    monkeypatch.setattr(actions, "CHUNK_ROWS", 2)
    for _ in range(7):
        make_job(kind="test.echo")
    text = run("cancel", "--all-matching", "--kind", "test.echo", "--user", "root")
    assert "cancel: 7 changed, 0 skipped" in text
    assert len(cancelled_ids()) == 7 and audited_ids() == cancelled_ids()


@pytest.mark.django_db
def test_a_limited_run_names_its_cursor_and_the_next_run_goes_on_from_it(make_job):
    User.objects.create_superuser("root", password="pw")
    jobs = [make_job(kind="test.echo", state=JobState.FAILED, attempt=1) for _ in range(5)]
    args = ("requeue", "--all-matching", "--kind", "test.echo", "--user", "root")
    text = run(*args, "--limit", "3")
    assert f"2 not processed (limit per action reached; go on after job {jobs[2].pk})" in text
    again = run(*args, "--after", str(jobs[2].pk))
    assert "requeue: 2 changed, 0 skipped" in again
    assert Job.objects.filter(state=JobState.QUEUED).count() == 5


@pytest.mark.django_db
def test_apply_goes_on_after_a_cursor_with_ids_or_a_queryset(make_job):
    user = User.objects.create_superuser("root", password="pw")
    jobs = [make_job() for _ in range(4)]
    first = actions.apply("cancel", Job.objects.all(), user=user, via="test", limit=2)
    assert first.last_id == jobs[1].pk and first.not_processed == 2
    rest = actions.apply("cancel", Job.objects.all(), user=user, via="test", after=first.last_id)
    assert [r.job_id for r in rest.changed] == [j.pk for j in jobs[2:]] and not rest.more
    ids = actions.apply("cancel", [j.pk for j in jobs], user=user, via="test", after=jobs[3].pk)
    assert ids.processed == 0


@pytest.mark.django_db(transaction=True)
def test_an_interrupted_run_leaves_every_change_of_its_committed_chunks_audited(
    make_job, monkeypatch
):
    user = User.objects.create_superuser("root", password="pw")
    monkeypatch.setattr(actions, "CHUNK_ROWS", 3, raising=False)
    jobs = [make_job() for _ in range(8)]
    calls = []

    def cancel_until_interrupted(job_id: int, actor: str):
        calls.append(job_id)
        if len(calls) == 8:  # the second job of the third chunk
            raise KeyboardInterrupt
        return transitions.cancel(job_id, actor)

    monkeypatch.setitem(actions.ACTIONS, "cancel", cancel_until_interrupted)
    with pytest.raises(KeyboardInterrupt):
        actions.apply("cancel", Job.objects.all(), user=user, via="test")
    assert cancelled_ids() == {j.pk for j in jobs[:6]}  # the third chunk rolled back whole
    assert audited_ids() == cancelled_ids()


@pytest.mark.django_db(transaction=True)
def test_sigint_to_cancel_all_matching_leaves_every_cancelled_job_audited(
    tmp_path: Path, second_connection
):
    """A real `manage.py jobs cancel --all-matching` interrupted mid-run (it used to leave 545
    jobs cancelled and no LogEntry); the run after it, from the cursor it printed, finishes.

    A job past the second chunk's size is row-locked from a second connection, so the run is
    waiting inside a later chunk (chunks end early after CHUNK_SECONDS) when SIGINT lands,
    however loaded the machine is (without the lock, a fast run could finish first, or be
    interrupted while printing its summary)."""
    User.objects.create_superuser("root", password="pw")
    total = 6_000
    Job.objects.bulk_create(
        [Job(kind="test.echo", queue="bulk", payload={"n": n}) for n in range(total)],
        batch_size=5_000,
    )
    ids = sorted(Job.objects.filter(queue="bulk").values_list("id", flat=True))
    blocker = ids[2 * CHUNK + 10]
    with second_connection.cursor() as cur:  # held until after the SIGINT (commit below)
        cur.execute("BEGIN")
        cur.execute("SELECT id FROM jobs_job WHERE id = %s FOR UPDATE", [blocker])
    env = {**os.environ, **subprocess_database_env(), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "manage.py", "jobs", "cancel", "--all-matching", "--queue", "bulk"]
    log = tmp_path / "cli.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--user", "root"], cwd=PROJECT_DIR, env=env, stdout=out, stderr=out
        )
        try:
            deadline = time.monotonic() + 120
            while not (cancelled_ids() and waits_on_a_lock(second_connection)):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the run did not reach the locked job"
                time.sleep(0.05)  # poll interval of a deadline-bound wait
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            second_connection.execute("COMMIT")
    printed = log.read_text()
    assert proc.returncode != 0, printed
    cancelled = cancelled_ids()
    assert 0 < len(cancelled) < total, printed  # a chunk is one job at least: one committed
    assert max(cancelled) < blocker  # the chunk that waited on the lock was rolled back
    assert audited_ids() == cancelled  # every change is audited, and nothing else
    cursor = int(printed.rsplit("--after ", 1)[1].split()[0])
    assert cursor == max(cancelled)
    done = subprocess.run(
        [*command, "--user", "root", "--after", str(cursor)],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"cancel: {total - len(cancelled)} changed, 0 skipped" in done.stdout
    assert len(cancelled_ids()) == total and audited_ids() == cancelled_ids()


def waits_on_a_lock(conn) -> bool:
    """Some other session of this database is waiting for a row lock (the CLI, on the blocker)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction it is cached
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.django_db(transaction=True)
def test_a_skipped_job_is_not_held_locked_while_the_rest_of_its_chunk_runs(
    make_job, monkeypatch, second_connection
):
    """A chunk is one transaction, yet a job it skips (a running one, for retry) is not kept
    locked until the chunk commits: its worker's heartbeat and commit go on meanwhile."""
    user = User.objects.create_superuser("root", password="pw")
    running = make_job(state=JobState.RUNNING, attempt=1)
    failed = make_job(state=JobState.FAILED, attempt=1)
    probes = []

    def retry_and_probe(job_id: int, actor: str):
        if job_id == failed.pk:  # the running job was decided (skipped) just before
            with second_connection.cursor() as cur:
                cur.execute("SELECT id FROM jobs_job WHERE id = %s FOR UPDATE NOWAIT", [running.pk])
                probes.append(cur.fetchone()[0])
        return transitions.retry_now(job_id, actor)

    monkeypatch.setitem(actions.ACTIONS, "retry", retry_and_probe)
    report = actions.apply("retry", [running.pk, failed.pk], user=user, via="test")
    assert probes == [running.pk]
    assert report.skipped == {"running: only failed or waiting jobs are retried": 1}
    assert [r.job_id for r in report.changed] == [failed.pk]


@pytest.mark.django_db
def test_a_chunk_ends_after_its_time_and_the_next_one_goes_on(make_job, monkeypatch):
    user = User.objects.create_superuser("root", password="pw")
    monkeypatch.setattr(actions, "CHUNK_SECONDS", 0.0)
    for _ in range(3):
        make_job()
    chunks = []
    report = actions.apply(
        "cancel",
        Job.objects.all(),
        user=user,
        via="test",
        progress=lambda r: chunks.append(r.processed),
    )
    assert chunks == [1, 2, 3] and len(report.changed) == 3 and not report.more
