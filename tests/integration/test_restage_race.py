"""A re-stage racing its attempt's commit: the committed output always names a file that exists.

A thread the handler left running re-stages a name while the handler returns and its worker
commits. The re-stage writes its file under a fresh name, then moves the row onto it in one
conditional UPDATE; only then is the earlier file deleted. Before, the re-stage checked the
attempt, deleted the earlier file and wrote its own: a commit landing after the check promoted a
row whose file was gone (and the late row was orphaned, so the janitor deleted the new one too).

The commit here is the real one, on the test's connection, while the re-stage (on its own
thread, so its own connection) waits inside a storage call.
"""

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage
from django.db import connection, transaction

import jobs
from jobs.core.exceptions import AttemptEnded
from jobs.effects import janitor, staging
from jobs.models import Job, StagedOutput
from tests.integration.attempts import Running, claim

pytestmark = pytest.mark.django_db(transaction=True)

A = "host-a:1"
LEAKED = "leaked-by-handler"


class _Gate:
    """Holds the leaked thread's first storage call of one kind until the test opens it."""

    def __init__(self) -> None:
        self.op = ""
        self.reached = threading.Event()
        self.go = threading.Event()
        self.failing_delete = ""  # a path whose delete raises, once
        self.failing_save = False  # the next save writes its file, then raises

    def at(self, op: str, name: str) -> None:
        if threading.current_thread().name != LEAKED:
            return
        if op == "delete" and name == self.failing_delete:
            self.failing_delete = ""
            raise OSError(f"storage refused to delete {name}")
        if op == self.op and not self.reached.is_set():
            self.reached.set()
            self.go.wait(10)


GATE = _Gate()


class _GatedStorage(FileSystemStorage):
    def _save(self, name: str, content: Any) -> str:
        GATE.at("save", name)
        written = super()._save(name, content)
        if GATE.failing_save and threading.current_thread().name == LEAKED:
            raise OSError(f"storage timed out writing {written}")
        return written

    def delete(self, name: str) -> None:
        GATE.at("delete", name)
        super().delete(name)


@pytest.fixture
def files(settings, tmp_path: Path) -> Path:
    global GATE
    GATE = _Gate()
    settings.STORAGES = {
        **settings.STORAGES,
        "gated": {"BACKEND": f"{__name__}._GatedStorage", "OPTIONS": {"location": str(tmp_path)}},
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "gated", "ORPHAN_GRACE_SECONDS": 0.0}
    return tmp_path


def _restage_on_a_leaked_thread(running: Running, content: bytes) -> tuple[threading.Thread, dict]:
    out: dict[str, Any] = {}

    def leaked() -> None:
        try:
            out["ref"] = running.ctx.stage("result.txt", content)
        except BaseException as exc:  # noqa: BLE001  handed to the test
            out["error"] = exc
        finally:
            connection.close()  # this thread's own

    thread = threading.Thread(target=leaked, name=LEAKED)
    thread.start()
    return thread, out


def _commit_while_the_restage_waits_in(op: str) -> dict:
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.stage("result.txt", b"the result")
    GATE.op = op
    thread, out = _restage_on_a_leaked_thread(running, b"late")
    assert GATE.reached.wait(10), out  # the re-stage is inside storage: the attempt still ran
    running.commit("ok")  # the real commit transition, on this test's own connection
    job = Job.objects.get()
    assert (job.state, job.result_ref) == ("succeeded", f"jobs/{job.pk}/attempt-1/")
    GATE.go.set()
    thread.join(10)
    assert not thread.is_alive()
    janitor.sweep("janitor-test")
    return out


def _files_in(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_commit_landing_while_a_restage_writes_keeps_the_committed_file(files):
    out = _commit_while_the_restage_waits_in("save")

    # The commit landed before the re-stage's UPDATE: refused, its own file deleted.
    assert isinstance(out.get("error"), AttemptEnded), out
    row = StagedOutput.objects.get()
    assert row.status == "promoted"
    assert (files / row.path).read_bytes() == b"the result"
    assert _files_in(files) == [row.path]  # nothing left behind


def test_a_commit_landing_while_a_restage_deletes_the_earlier_file_keeps_the_new_one(files):
    out = _commit_while_the_restage_waits_in("delete")

    # The re-stage's UPDATE came first: the row the commit promoted names the new file.
    assert "error" not in out, out
    row = StagedOutput.objects.get()
    assert (row.status, row.path, row.size) == ("promoted", out["ref"], len(b"late"))
    assert (files / row.path).read_bytes() == b"late"
    assert _files_in(files) == [row.path]  # the earlier file deleted


def test_an_earlier_file_the_storage_would_not_delete_is_left_to_the_janitor(files):
    jobs.enqueue("test.echo")
    running = claim(A)
    first = running.ctx.stage("result.txt", b"first")
    GATE.failing_delete = first
    thread, out = _restage_on_a_leaked_thread(running, b"second")
    thread.join(10)

    assert "error" not in out, out  # the replacement stands; only the clean-up failed
    assert (files / out["ref"]).read_bytes() == b"second"
    assert (files / first).exists()
    running.commit("ok")
    janitor.sweep("janitor-test")
    assert _files_in(files) == [out["ref"]]
    row = StagedOutput.objects.get(name="result.txt")
    assert (row.status, row.path) == ("promoted", out["ref"])


def test_a_restage_whose_write_fails_keeps_the_earlier_file_and_leaves_nothing_unknown(files):
    # The storage wrote the new file, then reported an error (a timeout on the answer).
    jobs.enqueue("test.echo")
    running = claim(A)
    first = running.ctx.stage("result.txt", b"the result")
    GATE.failing_save = True
    thread, out = _restage_on_a_leaked_thread(running, b"late")
    thread.join(10)

    assert isinstance(out.get("error"), OSError), out
    assert (files / first).read_bytes() == b"the result"
    running.commit("ok")
    janitor.sweep("janitor-test")
    row = StagedOutput.objects.get(name="result.txt")
    assert (row.status, row.path) == ("promoted", first)
    assert _files_in(files) == [first]  # the new file, recorded before it was written, deleted


def _blocks(cur: Any, mine: int, other: int) -> None:
    """Until `other`'s backend waits on a lock this one holds (deadline 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        cur.execute("SELECT %s = ANY(pg_blocking_pids(%s))", [mine, other])
        if cur.fetchone()[0]:
            return
        assert time.monotonic() < deadline, "the worker's discard never waited on the row"
        time.sleep(0.01)


def test_a_restage_moving_the_row_while_its_worker_discards_leaves_its_file_to_the_janitor(files):
    # A re-stage's UPDATE took its snapshot while the attempt still ran, and is not committed
    # yet when the attempt fails and its worker discards: the worker reads the earlier path and
    # deletes that file. Before, it then marked the row `discarded` -- naming the new file,
    # which nobody would ever delete. The row is left `staged` now, for the janitor.
    job = jobs.enqueue("test.echo")
    running = claim(A)
    first = running.ctx.stage("result.txt", b"first")
    new = staging.storage().save(f"jobs/{job.pk}/attempt-1/result_racing.txt", ContentFile(b"2"))
    connection.ensure_connection()
    worker_pid = connection.connection.info.backend_pid
    moved, out = threading.Event(), {}

    def restage_in_flight() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cur:
                cur.execute("UPDATE jobs_stagedoutput SET path = %s WHERE path = %s", [new, first])
                moved.set()
                _blocks(cur, connection.connection.info.backend_pid, worker_pid)
        except BaseException as exc:  # noqa: BLE001  handed to the test
            out["error"] = exc
        finally:
            connection.close()  # this thread's own

    thread = threading.Thread(target=restage_in_flight, name="restage-in-flight")
    thread.start()
    assert moved.wait(10)
    running.fail("boom")  # its worker discards the attempt's outputs, on this connection
    thread.join(10)
    assert "error" not in out, out

    row = StagedOutput.objects.get()
    assert (row.status, row.path) == ("staged", new)
    janitor.sweep("janitor-test")
    assert _files_in(files) == []


def test_a_restage_refused_by_a_failed_attempt_whose_clean_up_fails_leaves_its_file_to_the_janitor(
    files,
):
    # The attempt fails while a re-stage writes its new file: the worker discards the attempt's
    # outputs, the spare row naming the new file among them (its file not written yet). The
    # re-stage is refused and deletes its file -- and the storage refuses that delete. Before,
    # the spare row was left `discarded`, which the janitor never reads: the file stayed for good.
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.stage("result.txt", b"first")
    GATE.op = "save"
    thread, out = _restage_on_a_leaked_thread(running, b"late")
    assert GATE.reached.wait(10), out
    GATE.failing_delete = StagedOutput.objects.get(name__startswith="~").path
    running.fail("boom")  # its worker discards the attempt's outputs, on this connection
    GATE.go.set()
    thread.join(10)
    assert not thread.is_alive()

    assert isinstance(out.get("error"), AttemptEnded), out
    janitor.sweep("janitor-test")
    assert _files_in(files) == []


def test_a_first_stage_settled_while_it_wrote_whose_undo_fails_leaves_its_file_to_the_janitor(
    files,
):
    # The same for a name's first stage: its row is `discarded` by the failed attempt's worker
    # while the file is being written; the file's own delete is then refused. Before, the
    # storage's error reached the handler and the file stayed for good (no row the janitor reads).
    job = jobs.enqueue("test.echo")
    running = claim(A)
    GATE.op = "save"
    thread, out = _restage_on_a_leaked_thread(running, b"late")  # its first stage of the name
    assert GATE.reached.wait(10), out
    GATE.failing_delete = f"jobs/{job.pk}/attempt-1/result.txt"
    running.fail("boom")
    GATE.go.set()
    thread.join(10)
    assert not thread.is_alive()

    assert isinstance(out.get("error"), AttemptEnded), out
    janitor.sweep("janitor-test")
    assert _files_in(files) == []
