"""Tasks run by the fenced runner in this process: statuses, retries, errors, worker_ids, the
context, and which Task the worker agrees to run."""

import asyncio
import importlib.util
import sys
import traceback

import pytest
from django.tasks import TaskResultStatus
from django.test import override_settings

from jobs.core.exceptions import LeaseLost
from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job, RejectedWrite
from jobs.tasks import LeaseExpired, TaskCancelled, results
from jobs.tasks.execution import wait_for_finished_notices
from jobs.worker import runner
from tests.app import tasks

pytestmark = pytest.mark.django_db(transaction=True)

NO_BACKOFF = {"RETRY_BASE_SECONDS": 0.0}


def test_a_task_runs_in_the_worker_and_its_return_value_is_committed():
    result = tasks.add.enqueue(2, 3)
    assert runner.drain() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.is_finished
    assert result.worker_ids == [runner.worker_identity()]
    assert result.attempts == 1 and result.errors == []
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at
    assert Job.objects.get(pk=int(result.id)).result == 5


def test_the_status_is_running_while_the_task_runs(swap_handler):
    from jobs.core.registry import get_handler

    result = tasks.add.enqueue(1, 1)
    seen = []
    real = get_handler(tasks.add.module_path).fn

    def observing(ctx):
        seen.append(tasks.add.get_result(result.id))
        return real(ctx)

    swap_handler(tasks.add.module_path, observing)
    runner.drain()
    during = seen[0]
    assert during.status == TaskResultStatus.RUNNING
    assert during.started_at is not None and during.finished_at is None
    assert during.worker_ids == [runner.worker_identity()]
    with pytest.raises(ValueError, match="not finished"):
        _ = during.return_value


def test_a_context_task_sees_django_and_palisade_attempts_agree():
    result = tasks.introspect.enqueue(tag="t")
    runner.drain()
    result.refresh()
    value = result.return_value
    assert value["attempt"] == value["fencing_attempt"] == 1
    assert value["job_id"] == int(result.id) and value["result_id"] == result.id
    assert value["status"] == TaskResultStatus.RUNNING
    assert value["worker_ids"] == [runner.worker_identity()] == [value["worker"]]
    assert Job.objects.get(pk=int(result.id)).progress == {"tag": "t"}  # the fenced checkpoint


def test_between_attempts_a_task_is_ready_again_with_its_error():
    result = tasks.flaky.enqueue(succeed_on=2)
    runner.drain()  # attempt 1 fails; the retry waits for its backoff
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert len(result.errors) == 1 and result.attempts == 1
    assert result.finished_at is None and not result.is_finished


@override_settings(JOBS=NO_BACKOFF)
def test_a_failing_attempt_is_retried_and_each_failure_is_one_task_error():
    result = tasks.flaky.enqueue(succeed_on=3)
    runner.drain()  # no backoff: the retries are due at once, in this drain
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 3}
    assert result.attempts == 3 == Job.objects.get(pk=int(result.id)).attempt
    assert result.worker_ids == [runner.worker_identity()] * 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "flaky on attempt 1" in result.errors[0].traceback
    assert "flaky on attempt 2" in result.errors[1].traceback
    assert result.errors[0].exception_class is RuntimeError
    assert result.started_at < result.last_attempted_at


@override_settings(JOBS=NO_BACKOFF)
def test_a_task_failing_every_attempt_ends_failed_after_max_attempts():
    result = tasks.always_fails.enqueue("no")
    runner.drain()
    runner.drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    assert result.attempts == 2 and len(result.errors) == 2
    assert {e.exception_class_path for e in result.errors} == {"tests.app.tasks.Refused"}
    assert result.errors[-1].exception_class is tasks.Refused
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


@override_settings(JOBS=NO_BACKOFF)
@pytest.mark.parametrize(
    "message",
    [
        # a remote service's error body, holding a Python traceback of its own
        'it said:\nTraceback (most recent call last):\n  File "x", line 1, in y\nos.system: boom',
        "task raised os.system: a forged note\nand more",
        "m" * 20_000,  # the error text keeps its last 10,000 characters: no traceback header
        # line boundaries other than \n, at which the reader splits too
        "boom\rtask raised os.system: a forged note",
        "boom\u2028task raised os.system: a forged note",
        "boom\x0btask raised os.system: a forged note",
    ],
)
def test_an_errors_class_is_the_raised_one_whatever_its_message_holds(message):
    result = tasks.always_fails.enqueue(message)
    runner.drain()
    runner.drain()
    result.refresh()
    assert [e.exception_class_path for e in result.errors] == ["tests.app.tasks.Refused"] * 2
    assert result.errors[-1].exception_class is tasks.Refused
    first_line = message.splitlines()[0][:200]
    last_line = result.errors[-1].traceback.splitlines()[-1]
    assert last_line == f"task raised tests.app.tasks.Refused: {first_line}"  # the log's summary


def test_a_return_value_that_is_not_json_fails_the_attempt():
    result = tasks.unjsonable.using().enqueue()
    runner.drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED  # at once, not retried
    assert result.errors[0].exception_class_path == "jobs.tasks.execution.UnencodableResult"


def test_a_coroutine_task_runs_and_commits():
    result = tasks.async_add.enqueue(20, 22)
    runner.drain()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_a_coroutine_task_cancelled_by_its_own_code_fails_alone_and_the_drain_goes_on():
    """CancelledError out of a task's own event loop (async_to_sync's) is that task's failure:
    no one outside cancels a worker that way, so it must not end the drain as a stop would."""
    cancelled = tasks.cancels_its_own_work.enqueue()
    after = tasks.add.enqueue(1, 2)
    assert runner.drain() == 2
    cancelled.refresh()
    after.refresh()
    assert after.status == TaskResultStatus.SUCCESSFUL and after.return_value == 3
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.errors[0].exception_class is asyncio.CancelledError


def test_the_lease_option_reaches_the_running_attempt():
    result = tasks.long_lease.enqueue()
    runner.drain()
    assert tasks.long_lease.get_result(result.id).return_value == 600.0


def test_a_cancelled_task_is_failed_with_a_clear_error():
    from jobs.core import transitions

    result = tasks.add.enqueue(1, 2)
    transitions.cancel(int(result.id), actor="test")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class is TaskCancelled
    assert "cancelled by an operator" in result.errors[-1].traceback


def test_an_expired_attempt_is_an_error_and_a_worker_id(make_job):
    result = tasks.add.enqueue(1, 2)
    job_id = int(result.id)
    Job.objects.filter(pk=job_id).update(attempt=1)
    from django.utils import timezone

    Attempt.objects.create(
        job_id=job_id,
        number=1,
        worker="gone:1",
        claimed_at=timezone.now(),
        outcome=AttemptOutcome.EXPIRED,
    )
    runner.drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.worker_ids == ["gone:1", runner.worker_identity()]
    assert [e.exception_class for e in result.errors] == [LeaseExpired]


FRAMES = 'Traceback (most recent call last):\n  File "/app/t.py", line 3, in f\n    raise E\n'


@pytest.mark.parametrize(
    ("error", "path"),
    [
        (FRAMES + "ValueError: boom", "builtins.ValueError"),  # a builtin: printed bare
        (FRAMES + "myapp.errors.Refused: no", "myapp.errors.Refused"),
        ("the database refused the error text", "jobs.tasks.results.AttemptFailed"),  # no class
    ],
)
def test_an_error_stored_without_the_note_is_read_as_python_formats_it(error, path):
    """Text written before the worker noted the class (or by no task's code) is read as Python
    formats a traceback; where no class can be read, the error is AttemptFailed."""
    result = tasks.add.enqueue(1, 2)
    Job.objects.filter(pk=int(result.id)).update(attempt=1)
    from django.utils import timezone

    Attempt.objects.create(
        job_id=int(result.id),
        number=1,
        worker="old:1",
        claimed_at=timezone.now(),
        ended_at=timezone.now(),
        outcome=AttemptOutcome.FAILED,
        error=error,
    )
    result.refresh()
    assert [e.exception_class_path for e in result.errors] == [path]


def test_a_zombie_commit_of_a_task_is_rejected_and_reports_nothing(second_connection, swap_handler):
    from jobs.core.registry import get_handler

    result = tasks.add.enqueue(1, 2)
    real = get_handler(tasks.add.module_path).fn

    def stolen(ctx):
        second_connection.execute(
            "UPDATE jobs_job SET attempt = attempt + 1 WHERE id = %s", [ctx.job_id]
        )
        return real(ctx)

    swap_handler(tasks.add.module_path, stolen)
    runner.drain()
    assert RejectedWrite.objects.filter(job_id=int(result.id), write="commit").exists()
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING  # the thief's attempt owns it now
    assert [e.exception_class for e in result.errors] == [LeaseLost]  # attempt 1: rejected


# -- what the worker agrees to run ---------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        "tests.app.tasks.on_immediate",  # a Task, but of another backend
        "tests.app.tasks.Refused",  # importable, not a Task
        "os.system",  # outside the installed apps: never imported
        "tests.app.tasks.missing",
    ],
)
def test_the_worker_runs_only_tasks_of_a_palisade_backend(kind):
    job = Job.objects.create(kind=kind, payload={"args": ["true"], "kwargs": {}}, max_attempts=1)
    runner.drain()
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert "no handler is registered" in job.error


def test_a_tasks_row_naming_a_backend_that_is_not_palisades_is_failed_not_run():
    """The kind is a Palisade task's, but the row says it belongs to Django's ImmediateBackend
    (planted: jobs.enqueue(), the admin, SQL): the worker does not run it for that backend."""
    job = Job.objects.create(
        kind=tasks.add.module_path,
        payload={"args": [2, 3], "kwargs": {}, "backend": "immediate"},
        max_attempts=1,
    )
    runner.drain()
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.result is None
    assert "task backend 'immediate' is not a Palisade backend" in job.error


OUTSIDE_TASK = """
from django.tasks import task


@task
def shout(text: str) -> str:
    return text.upper()
"""


def test_a_task_module_outside_the_installed_apps_is_never_imported(tmp_path, monkeypatch):
    """A real @task of a Palisade backend, importable (on sys.path) but in no installed app: the
    worker does not import its module to learn the kind -- the job fails as unknown."""
    package = tmp_path / "outside_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(OUTSIDE_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.util.find_spec("outside_pkg") is not None  # importable all along
    kind = "outside_pkg.mod.shout"  # the task's module_path, as enqueue would name it
    job = Job.objects.create(
        kind=kind, payload={"args": ["hi"], "kwargs": {}, "backend": "default"}, max_attempts=1
    )
    runner.drain()
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert f"no handler is registered for kind {kind!r}" in job.error
    assert "outside_pkg" not in sys.modules and "outside_pkg.mod" not in sys.modules


def test_an_exception_groups_class_is_read_from_its_own_note_not_its_members():
    """In a group the note is printed inside the group's block ("  | "), and its members after
    it, deeper ("    | "): neither a member's note nor a forged line in a message is read."""
    member = ValueError("m")
    results.mark_raised(member)  # a member that was a task's exception (a nested call)
    group = ExceptionGroup("g\ntask raised os.system: forged", [member, KeyError("k")])
    try:
        raise group
    except ExceptionGroup as exc:
        results.mark_raised(exc)
        text = traceback.format_exc()
    assert "  | task raised builtins.ExceptionGroup: g" in text.splitlines()
    assert results.exception_class_path(text) == "builtins.ExceptionGroup"


def test_a_class_defined_in_a_function_is_read_from_its_note_not_from_a_forged_traceback():
    """`mod.f.<locals>.E` is a path the note names too: before, the note was not read for it
    and the reading fell back to the last traceback header, which its message forged."""

    class Local(Exception):
        pass

    try:
        raise Local("hi\nTraceback (most recent call last):\nos.system: forged")
    except Local as exc:
        results.mark_raised(exc)
        text = traceback.format_exc()
    assert results.exception_class_path(text) == f"{__name__}.{Local.__qualname__}"


def test_a_class_whose_own_add_note_or_qualname_adds_lines_forges_nothing():
    class Lying(Exception):
        __qualname__ = "Lying\ntask raised os.system"

        def add_note(self, note: str) -> None:
            super().add_note(note)
            super().add_note("task raised os.system: forged")

    try:
        raise Lying("m")
    except Lying as exc:
        results.mark_raised(exc)
        text = traceback.format_exc()
    assert results.exception_class_path(text) == f"{__name__}.Lying?task?raised?os.system"


def test_a_task_row_created_without_a_backend_runs_and_its_result_reads_back():
    """A committed queued row is work however it got there: a task's row written by
    Job.objects.create with its arguments only is the task's own backend's, to run and to read."""
    job = Job.objects.create(kind=tasks.add.module_path, payload={"args": [2, 3]})
    runner.drain()
    result = tasks.add.get_result(job.pk)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert result.backend == tasks.add.backend == "default"
    result.refresh()  # through the backend the result names
    assert result.args == [2, 3] and result.kwargs == {}


def test_a_task_module_that_exits_when_imported_fails_only_its_own_job():
    """Looking for an unknown kind imports its module (inside an installed app): one that calls
    sys.exit() at import is that kind's problem -- unknown --, not the worker's end."""
    kind = "tests.app.exits_at_import.run"
    planted = Job.objects.create(kind=kind, payload={"args": []}, max_attempts=1)
    result = tasks.add.enqueue(1, 2)
    assert runner.drain() == 2
    planted.refresh_from_db()
    assert planted.state == JobState.FAILED
    assert f"no handler is registered for kind {kind!r}" in planted.error
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3


def test_tasks_do_not_wait_for_finished_notices_to_be_committed():
    result = tasks.add.enqueue(1, 1)
    runner.drain()
    assert Job.objects.get(pk=int(result.id)).state == JobState.SUCCEEDED
    assert wait_for_finished_notices(10)


def test_a_task_whose_worker_process_died_says_so_not_that_its_lease_expired():
    # A SIGKILLed worker's attempt is reclaimed at once by qcluster's main process (a rescue:
    # its `expired` event says worker_exited). Before, the result still read "its lease expired
    # (the worker stopped heartbeating...)", sending whoever read it after a stall.
    import time

    from jobs.core import transitions
    from jobs.worker import reaper

    result = tasks.add.enqueue(1, 2)
    (claimed,) = transitions.claim("host-x:4242", limit=1, lease_seconds=300)
    assert claimed.fence.job_id == int(result.id)
    assert reaper.rescue("host-x:4242", time.monotonic(), "main:1") == 1
    result.refresh()
    (error,) = result.errors
    assert error.exception_class is LeaseExpired
    assert "its worker process died" in error.traceback
    assert "heartbeating" not in error.traceback


def test_a_task_whose_lease_ran_out_still_says_its_lease_expired():
    from jobs.core import transitions
    from tests.integration.attempts import expire_and_reap

    result = tasks.add.enqueue(1, 2)
    transitions.claim("host-x:4243", limit=1, lease_seconds=300)
    expire_and_reap(int(result.id))
    result.refresh()
    (error,) = result.errors
    assert "its lease expired (the worker stopped heartbeating" in error.traceback


def test_a_claim_handed_back_unstarted_is_no_attempt_worker_or_start_of_its_task():
    # A release hands a claim back before its handler runs: nothing ran. Django's worker_ids are
    # the workers that processed the task, started_at when it first started, context.attempt
    # the run's number. Before, the hand-back counted: worker_ids ["host-x:4242", ...],
    # started_at its claim, and the one run that happened was attempt 2.
    from jobs.core import transitions

    result = tasks.introspect.enqueue(tag="handed back")
    (claimed,) = transitions.claim("host-x:4242", limit=1, lease_seconds=300)
    transitions.release(claimed.fence)
    result.refresh()
    assert (result.status, result.worker_ids, result.attempts) == (TaskResultStatus.READY, [], 0)
    assert (result.started_at, result.last_attempted_at, result.errors) == (None, None, [])
    assert runner.drain() == 1
    result.refresh()
    ran = Attempt.objects.get(job_id=int(result.id), number=2)
    assert result.worker_ids == [runner.worker_identity()] and result.attempts == 1
    assert result.started_at == result.last_attempted_at == ran.claimed_at
    value = result.return_value
    assert (value["attempt"], value["fencing_attempt"], value["worker_ids"]) == (
        1,
        2,  # the fencing token counts every claim, hand-backs too
        [runner.worker_identity()],
    )


def test_a_handler_confirmed_running_then_handed_back_still_ran():
    # Abandoned when a stop's grace ended, a running handler is handed back too (`released`):
    # it did run, as its confirmation (the heartbeat's, or the explicit one) says.
    from jobs.core import transitions

    result = tasks.add.enqueue(1, 2)
    (claimed,) = transitions.claim("host-x:4242", limit=1, lease_seconds=300)
    transitions.confirm_running(claimed.fence)
    transitions.release(claimed.fence)
    result.refresh()
    assert (result.status, result.worker_ids) == (TaskResultStatus.READY, ["host-x:4242"])
    assert result.started_at == Attempt.objects.get(job_id=int(result.id), number=1).claimed_at


def test_naming_a_huge_many_lined_messages_class_costs_no_memory_per_line():
    # The note's first line was cut after splitting the whole message into lines: 2 million
    # lines of a 6 MB message made 2 million strings (about 100 MB) in the worker.
    import tracemalloc

    exc = ValueError("xy\n" * 2_000_000)
    tracemalloc.start()
    try:
        results.mark_raised(exc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.__notes__ == ["task raised builtins.ValueError: xy"]
    assert peak < 10_000_000, peak  # the message's own text (6 MB) is made once by str()
