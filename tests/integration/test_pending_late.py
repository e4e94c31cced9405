"""What a handler's leaked thread records after its attempt ended: refused with a clear error,
never held in memory for good.

An attempt's intents and staged-output mark live in memory (jobs/effects/pending.py) until its
final write is decided, which forgets them. Before, a thread the handler left running that
called ctx.intent() (or ctx.stage()) after that moment made a fresh entry for the ended attempt:
nothing would ever commit or forget it -- up to 1 MB per attempt kept for the life of the worker
process, and the intent silently never performed.
"""

import threading
from typing import Any

import pytest
from django.core.files.storage import FileSystemStorage
from django.db import connection

import jobs
from jobs.core.exceptions import AttemptEnded, LeaseLost
from jobs.effects import janitor, pending
from jobs.models import Intent, Job, StagedOutput
from tests.integration.attempts import Running, claim

pytestmark = pytest.mark.django_db(transaction=True)

A = "host-a:1"
HOOK = {"url": "http://127.0.0.1:9/hook", "json": {}}


def _record(running: Running, record: str, out: dict) -> None:
    """On a thread the handler left running: `record` ("intent" or "stage"); what it raised goes
    to out["error"]."""
    try:
        if record == "intent":
            running.ctx.intent("late", "webhook", HOOK)
        else:
            running.ctx.stage("late.txt", b"late")
    except BaseException as exc:  # noqa: BLE001  handed to the test
        out["error"] = exc
    finally:
        connection.close()  # this thread's own


def _from_a_leaked_thread(running: Running, record: str) -> BaseException | None:
    """`record` ("intent" or "stage") called on a thread the handler started and left running,
    once its attempt has ended; what it raised."""
    ended, out = threading.Event(), {}

    def leaked() -> None:
        ended.wait(10)
        _record(running, record, out)

    thread = threading.Thread(target=leaked, name="leaked-by-handler")
    thread.start()
    running.commit("ok")  # the handler returned; its attempt's final write is decided
    ended.set()
    thread.join(10)
    assert not thread.is_alive()
    return out.get("error")


@pytest.mark.parametrize("record", ["intent", "stage"])
def test_a_record_after_the_attempts_commit_is_refused_and_held_nowhere(record):
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.intent("publish", "webhook", HOOK)
    error = _from_a_leaked_thread(running, record)
    assert pending.peek(running.held) is None  # nothing kept for the ended attempt
    assert running.held.work.intents == {}  # nor by the ctx the leaked thread still holds
    assert isinstance(error, AttemptEnded) and isinstance(error, LeaseLost), error
    assert f"{record} after its attempt ended" in str(error)
    assert list(Intent.objects.values_list("step", flat=True)) == ["publish"]
    assert not StagedOutput.objects.filter(name="late.txt").exists()  # refused before writing


def test_a_record_after_a_failed_attempt_is_refused_too():
    jobs.enqueue("test.echo")
    running = claim(A)
    running.fail("boom")
    with pytest.raises(AttemptEnded):
        try:
            running.ctx.intent("late", "webhook", HOOK)
        finally:
            assert pending.peek(running.held) is None


def test_an_attempt_that_recorded_nothing_still_refuses_a_late_record():
    # Nothing recorded before the end: there was no entry to forget, and the late one used to
    # make one that nobody would ever forget.
    jobs.enqueue("test.echo")
    running = claim(A)
    running.commit("ok")
    with pytest.raises(AttemptEnded):
        try:
            running.ctx.intent("late", "webhook", HOOK)
        finally:
            assert pending.peek(running.held) is None


class _SlowSaves(FileSystemStorage):
    """A storage whose saves of `late.txt` wait until the test lets them finish."""

    saving = threading.Event()
    finish = threading.Event()

    def _save(self, name: str, content: Any) -> str:
        if name.endswith("late.txt"):
            type(self).saving.set()
            type(self).finish.wait(10)
        return super()._save(name, content)


def test_an_output_whose_attempt_ended_while_it_was_written_is_orphaned_not_promoted(
    settings, tmp_path
):
    # The leaked thread's stage() passed the check, then the attempt committed while its file
    # was written into the committed attempt's prefix. Before, the janitor then promoted it: a
    # file the commit never named became part of the job's result.
    settings.STORAGES = {
        **settings.STORAGES,
        "slow": {"BACKEND": f"{__name__}._SlowSaves", "OPTIONS": {"location": str(tmp_path)}},
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "slow", "ORPHAN_GRACE_SECONDS": 0.0}
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.stage("result.txt", b"the result")
    out: dict[str, BaseException] = {}

    def leaked() -> None:
        try:
            running.ctx.stage("late.txt", b"late")
        except BaseException as exc:  # noqa: BLE001  handed to the test
            out["error"] = exc
        finally:
            connection.close()  # this thread's own

    thread = threading.Thread(target=leaked, name="leaked-by-handler")
    thread.start()
    assert _SlowSaves.saving.wait(10)
    running.commit("ok")  # the handler returned; the leaked thread's file is still being written
    _SlowSaves.finish.set()
    thread.join(10)
    assert isinstance(out.get("error"), AttemptEnded), out

    janitor.sweep("janitor-test")
    by_name = dict(StagedOutput.objects.values_list("name", "status"))
    assert by_name == {"result.txt": "promoted", "late.txt": "orphaned"}
    prefix = Job.objects.get().result_ref
    assert sorted(FileSystemStorage(location=str(tmp_path)).listdir(prefix)[1]) == ["result.txt"]


@pytest.mark.parametrize("swept_first", [False, True], ids=["staged", "promoted"])
def test_a_late_restage_never_deletes_the_file_its_attempt_committed(
    settings, tmp_path, monkeypatch, swept_first
):
    # A leaked thread re-stages a name its handler staged; its in-memory check passed, then the
    # attempt committed (and, in one case, the janitor promoted the output). Before, the re-stage
    # deleted the committed file, wrote its own, and the late row was orphaned: the janitor then
    # deleted that too -- the job's committed result lost its file.
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "files", "ORPHAN_GRACE_SECONDS": 0.0}
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.stage("result.txt", b"the result")
    passed, committed = threading.Event(), threading.Event()
    check_open = pending.check_open

    def check_then_lose_the_race(held: pending.Holder, what: str) -> None:
        check_open(held, what)
        if threading.current_thread().name == "leaked-by-handler":
            passed.set()
            committed.wait(10)

    monkeypatch.setattr(pending, "check_open", check_then_lose_the_race)
    out: dict[str, BaseException] = {}

    def leaked() -> None:
        try:
            running.ctx.stage("result.txt", b"late")
        except BaseException as exc:  # noqa: BLE001  handed to the test
            out["error"] = exc
        finally:
            connection.close()  # this thread's own

    thread = threading.Thread(target=leaked, name="leaked-by-handler")
    thread.start()
    assert passed.wait(10)
    running.commit("ok")
    if swept_first:
        janitor.sweep("janitor-test")
    committed.set()
    thread.join(10)
    assert isinstance(out.get("error"), AttemptEnded), out

    janitor.sweep("janitor-test")
    assert dict(StagedOutput.objects.values_list("name", "status")) == {"result.txt": "promoted"}
    result = tmp_path / Job.objects.get().result_ref / "result.txt"
    assert result.read_bytes() == b"the result"


@pytest.mark.parametrize("record", ["intent", "stage"])
def test_a_record_after_the_commit_read_the_attempts_work_is_refused_not_dropped(
    monkeypatch, record
):
    # The commit reads the attempt's work (peek), writes, then forgets it. Before, a leaked
    # thread's record in between was accepted -- into no commit -- and dropped by the forget
    # without a word: an intent never performed, a staged file its commit never named.
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.intent("publish", "webhook", HOOK)
    out: dict[str, BaseException] = {}
    read = pending.peek_many  # the commit reads its batch's work at once

    def read_then_a_leaked_record(helds):  # type: ignore[no-untyped-def]
        work = read(helds)

        thread = threading.Thread(
            target=_record, args=(running, record, out), name="leaked-by-handler"
        )
        thread.start()
        thread.join(10)
        return work

    monkeypatch.setattr(pending, "peek_many", read_then_a_leaked_record)
    running.commit("ok")
    assert isinstance(out.get("error"), AttemptEnded), out
    assert list(Intent.objects.values_list("step", flat=True)) == ["publish"]
    assert not StagedOutput.objects.filter(name="late.txt", status="staged").exists()
