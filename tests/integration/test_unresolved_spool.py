"""The spool of final writes given up on survives bad entries and reaches every entry."""

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from jobs.core.states import EventType
from jobs.core.transitions import Fence
from jobs.models import Attempt, JobEvent
from jobs.worker import unresolved

pytestmark = pytest.mark.django_db


@pytest.fixture
def spool(settings, tmp_path: Path, monkeypatch) -> Path:
    settings.JOBS = {**settings.JOBS, "UNRESOLVED_DIR": str(tmp_path)}
    monkeypatch.setattr(unresolved, "_cursor", {"after": ""}, raising=False)  # a fresh scan
    return tmp_path


def decided_attempt(make_job) -> Attempt:
    job = make_job(state="running", attempt=1)
    Attempt.objects.filter(job=job, number=1).update(outcome="failed")  # decided meanwhile
    return Attempt.objects.get(job=job, number=1)


def write_entry(spool: Path, name: str, entry: object) -> Path:
    path = spool / name
    path.write_text(json.dumps(entry))
    return path


def good_entry(attempt: Attempt) -> dict[str, object]:
    return {
        "database": unresolved._database(),
        "job_id": attempt.job_id,
        "attempt": attempt.number,
        "worker": "host:1",
        "write": "succeeded",
        "gave_up_at": "2026-01-01T00:00:00+00:00",
    }


def unresolved_events(attempt: Attempt) -> int:
    return JobEvent.objects.filter(job_id=attempt.job_id, type=EventType.UNRESOLVED).count()


@pytest.mark.parametrize(
    "bad",
    [
        {"attempt": 1, "write": "succeeded"},  # no job_id: a KeyError crashed qcluster
        {"job_id": "x", "attempt": 1, "write": "succeeded"},
        {"job_id": 1, "attempt": [1], "write": "succeeded"},
        {"job_id": 10**30, "attempt": 1, "write": "succeeded"},
        {"job_id": 1, "attempt": 1, "write": {"no": "such"}},
        ["not", "an", "object"],
        "not JSON at all",
        {"job_id": 1, "attempt": 1, "write": "succeeded", "padding": "x" * 100_000},
    ],
)
def test_a_malformed_entry_is_quarantined_with_one_log_line(spool, make_job, caplog, bad):
    attempt = decided_attempt(make_job)
    if isinstance(bad, dict):
        bad = {"database": unresolved._database(), **bad}
    bad_path = write_entry(spool, "job-0-attempt-1-succeeded.json", bad)  # sorts first
    if bad == "not JSON at all":
        bad_path.write_text(bad)
    write_entry(spool, f"job-{attempt.job_id}-attempt-1-succeeded.json", good_entry(attempt))
    with caplog.at_level(logging.ERROR, logger="jobs.unresolved"):
        assert unresolved.resolve_pending() == 1  # the good one still resolves
    assert not bad_path.exists()
    assert (spool / "quarantine" / bad_path.name).exists()
    lines = [r for r in caplog.records if bad_path.name in r.getMessage()]
    assert len(lines) == 1 and "malformed" in lines[0].getMessage()
    assert unresolved_events(attempt) == 1
    assert unresolved.resolve_pending() == 0  # nothing left, nothing raised


def test_every_entry_is_reached_behind_many_of_other_databases(spool, make_job):
    attempt = decided_attempt(make_job)
    foreign = {**good_entry(attempt), "database": "postgresql:another_database"}
    for n in range(60):  # they sort before this database's entry
        write_entry(spool, f"job-0{n:03d}-attempt-1-succeeded.json", foreign)
    write_entry(spool, f"job-9{attempt.job_id}-attempt-1-succeeded.json", good_entry(attempt))
    for _ in range(5):  # a few scheduler ticks
        unresolved.resolve_pending()
    assert unresolved_events(attempt) == 1
    assert len(list(spool.glob("job-0*.json"))) == 60  # another database's: left alone


def test_the_spool_folder_is_fsynced_after_the_rename(spool, monkeypatch, make_job):
    steps: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        steps.append(("fsync", "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        steps.append(("rename", Path(str(dst)).name))
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    job = make_job(state="running", attempt=1)
    unresolved.record([Fence(job_id=job.pk, attempt=1, worker="host:1")], "failed")
    name = f"job-{job.pk}-attempt-1-failed.json"
    assert (spool / name).exists()
    assert steps == [("fsync", "file"), ("rename", name), ("fsync", "dir")]
