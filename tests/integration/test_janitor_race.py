"""The janitor deletes what it says it deletes, against a storage with S3-like latency: a zombie
still writing its output while the janitor settles that output's row leaves no file behind, and
"orphaned output deleted" is logged only after the deletion."""

import logging
import threading
from pathlib import Path

import pytest
from django.core.files.storage import FileSystemStorage
from django.db import connection

import jobs
from jobs.effects import janitor
from jobs.models import JobEvent, StagedOutput
from tests.integration.attempts import claim, expire_and_reap
from tests.slow_receivers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

JANITOR_THREAD = "test-janitor"


class LaggingStorage(FileSystemStorage):
    """A filesystem storage with latency where S3 has it: a write lands only once the janitor's
    delete request has gone out; the janitor hears its delete's answer only once the writer is
    done (the file system applies the delete at once)."""

    delete_sent = threading.Event()
    writer_done = threading.Event()

    def _save(self, name: str, content: object) -> str:
        assert type(self).delete_sent.wait(10), "the janitor never deleted"
        return super()._save(name, content)  # type: ignore[arg-type]

    def delete(self, name: str) -> None:
        super().delete(name)
        if threading.current_thread().name == JANITOR_THREAD:
            type(self).delete_sent.set()
            type(self).writer_done.wait(10)  # the answer takes its time


def test_a_zombie_writing_while_the_janitor_settles_its_output_leaves_no_file(
    settings, tmp_path: Path, caplog
):
    settings.STORAGES = {
        **settings.STORAGES,
        "lagging": {
            "BACKEND": f"{__name__}.LaggingStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "lagging", "ORPHAN_GRACE_SECONDS": 0.0}
    job = jobs.enqueue("test.echo")
    zombie = claim("host-a:1")
    expire_and_reap(job.pk)  # attempt 1 is over; its worker does not know yet

    def zombie_stages() -> None:
        try:
            zombie.ctx.stage("out.txt", b"late zombie output")
        finally:
            connection.close()
            LaggingStorage.writer_done.set()

    writer = threading.Thread(target=zombie_stages, daemon=True)
    writer.start()
    wait_for(StagedOutput.objects.exists, 10, "the zombie never recorded its output")

    deleted: list[int] = []

    def sweep() -> None:
        try:
            deleted.append(janitor.sweep("janitor:1"))
        finally:
            connection.close()

    with caplog.at_level(logging.WARNING, logger="jobs.janitor"):
        sweeper = threading.Thread(target=sweep, name=JANITOR_THREAD, daemon=True)
        sweeper.start()
        writer.join(20)
        sweeper.join(20)

    row = StagedOutput.objects.get()
    assert deleted == [1] and row.status == "orphaned" and row.settled_at is not None
    assert not (tmp_path / row.path).exists(), "the zombie's file leaked"
    assert not list(tmp_path.rglob("*.txt"))
    assert JobEvent.objects.filter(job_id=job.pk, type="orphaned").count() == 1
    assert any("orphaned output deleted" in r.getMessage() for r in caplog.records)


class FailingDeletes(FileSystemStorage):
    failing = True

    def delete(self, name: str) -> None:
        if type(self).failing:
            raise OSError("storage unavailable")
        super().delete(name)


def test_a_failed_delete_is_not_reported_and_is_retried_by_the_next_sweep(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "failing": {
            "BACKEND": f"{__name__}.FailingDeletes",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "failing", "ORPHAN_GRACE_SECONDS": 0.0}
    job = jobs.enqueue("test.echo")
    lost = claim("host-a:1")
    lost.ctx.stage("out.txt", b"x")
    expire_and_reap(job.pk)

    assert janitor.sweep("janitor:1") == 0
    row = StagedOutput.objects.get()
    assert (row.status, row.settled_at) == ("orphaned", None)  # decided, not yet deleted
    assert (tmp_path / row.path).exists()
    assert not JobEvent.objects.filter(type="orphaned").exists()

    FailingDeletes.failing = False
    assert janitor.sweep("janitor:1") == 1
    assert not (tmp_path / row.path).exists()
    assert JobEvent.objects.filter(type="orphaned").count() == 1


class StuckDeletes(FileSystemStorage):
    """A storage that refuses, for good, to delete some outputs (a prefix it may not touch)."""

    def delete(self, name: str) -> None:
        if "/stuck" in name:
            raise PermissionError(f"may not delete {name}")
        super().delete(name)


def test_outputs_whose_delete_keeps_failing_never_hold_back_the_other_orphans(settings, tmp_path):
    """Before, every sweep retried the same oldest undeleted orphans first: a batch of them whose
    delete kept failing (a permission, a key the storage refuses) meant no later orphan was ever
    deleted, and the same errors logged at every sweep."""
    settings.STORAGES = {
        **settings.STORAGES,
        "stuck": {"BACKEND": f"{__name__}.StuckDeletes", "OPTIONS": {"location": str(tmp_path)}},
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "stuck", "ORPHAN_GRACE_SECONDS": 0.0}
    job = jobs.enqueue("test.echo")
    lost = claim("host-a:1")
    for name in ("stuck-1.txt", "stuck-2.txt", "stuck-3.txt", "fine.txt"):
        lost.ctx.stage(name, b"x")  # staged in this order: the stuck ones are the oldest
    expire_and_reap(job.pk)
    fine = StagedOutput.objects.get(name="fine.txt")

    deleted = sum(janitor.sweep("janitor:1", limit=2) for _ in range(3))
    assert deleted == 1
    assert not (tmp_path / fine.path).exists()
    assert StagedOutput.objects.get(pk=fine.pk).settled_at is not None
    assert StagedOutput.objects.filter(settled_at__isnull=True).count() == 3  # retried, later
