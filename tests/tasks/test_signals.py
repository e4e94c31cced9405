"""task_enqueued, task_started, task_finished: Django's sender and arguments, sent after the
write they announce landed, never for a rejected one, and powerless over the task's outcome."""

import logging
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test import override_settings

import jobs
from jobs.models import Attempt, Job, RejectedWrite
from jobs.tasks import LeaseExpired, MalformedTask, PalisadeBackend
from jobs.tasks.execution import _send_finished, wait_for_finished_notices
from jobs.worker import reaper, runner
from tests.app import tasks

pytestmark = pytest.mark.django_db(transaction=True)

SIGNALS = {"enqueued": task_enqueued, "started": task_started, "finished": task_finished}


@pytest.fixture
def heard() -> Iterator[list[tuple[str, type, object]]]:
    """Every task signal this process sends during the test: (name, sender, task_result)."""
    events: list[tuple[str, type, object]] = []
    receivers = {}
    for name, signal in SIGNALS.items():

        def receiver(sender, task_result, _name=name, **kwargs):
            events.append((_name, sender, task_result))

        receivers[name] = receiver
        signal.connect(receiver, weak=False)
    yield events
    for name, signal in SIGNALS.items():
        signal.disconnect(receivers[name])


def _of(heard, job_id: str) -> list[tuple[str, TaskResultStatus]]:
    return [(name, result.status) for name, _, result in heard if result.id == job_id]


def test_signals_come_in_order_with_djangos_sender_and_arguments(heard):
    result = tasks.add.enqueue(1, 2)
    runner.drain()
    assert wait_for_finished_notices(10)
    assert _of(heard, result.id) == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    assert {sender for _, sender, _ in heard} == {PalisadeBackend}
    finished = heard[-1][2]
    assert finished.return_value == 3 and finished.finished_at is not None
    assert finished.worker_ids == [runner.worker_identity()]


def test_task_enqueued_waits_for_the_callers_commit(heard):
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert heard == []
    assert _of(heard, result.id) == [("enqueued", TaskResultStatus.READY)]


def test_a_rolled_back_enqueue_sends_nothing(heard):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 2)
        raise RuntimeError("roll back")
    assert heard == [] and Job.objects.count() == 0


def test_a_duplicate_enqueue_sends_nothing(heard):
    first = tasks.singleton.enqueue(1)
    tasks.singleton.enqueue(2)
    assert _of(heard, first.id) == [("enqueued", TaskResultStatus.READY)]


@override_settings(JOBS={"RETRY_BASE_SECONDS": 0.0})
def test_retries_start_again_and_finish_once(heard):
    result = tasks.flaky.enqueue(succeed_on=2)
    runner.drain()
    assert wait_for_finished_notices(10)
    assert _of(heard, result.id) == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    started = [r for name, _, r in heard if name == "started"]
    assert [r.attempts for r in started] == [1, 2]


@override_settings(JOBS={"RETRY_BASE_SECONDS": 0.0})
def test_the_failure_that_ends_a_task_is_finished_failed(heard):
    result = tasks.always_fails.enqueue("x")
    runner.drain()
    assert wait_for_finished_notices(10)
    names = _of(heard, result.id)
    assert names[-1] == ("finished", TaskResultStatus.FAILED)
    assert [n for n, _ in names].count("finished") == 1
    assert len(heard[-1][2].errors) == 2


def test_a_zombies_rejected_commit_sends_no_task_finished(heard, second_connection, swap_handler):
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
    assert wait_for_finished_notices(10)
    assert RejectedWrite.objects.filter(job_id=int(result.id), write="commit").exists()
    assert [name for name, _ in _of(heard, result.id)] == ["enqueued", "started"]


def test_the_reapers_final_expiry_is_finished_failed(heard, make_job):
    job = make_job(
        kind=tasks.add.module_path,
        state="running",
        attempt=1,
        lease_in=-5,
        max_attempts=1,
        payload={"args": [1, 2], "kwargs": {}, "backend": "default"},
    )
    assert reaper.reap("test-reaper") == 1
    assert wait_for_finished_notices(10)
    assert _of(heard, str(job.pk)) == [("finished", TaskResultStatus.FAILED)]
    assert [e.exception_class for e in heard[-1][2].errors] == [LeaseExpired]


MALFORMED = [
    {"backend": "default", "args": 5},
    {"backend": "default", "args": [1, 2], "kwargs": [["a", 1]]},
    {"backend": "default", "args": [1, 2], "run_after": "not a date"},
    [1, 2],
]


@pytest.mark.parametrize("payload", MALFORMED)
def test_a_malformed_task_row_costs_no_other_task_its_task_finished(heard, caplog, payload):
    # Before: one malformed row raised while its batch was built and every notice of the batch
    # was lost. A row of a task's kind with any payload: jobs.enqueue(), the admin, SQL.
    bad = jobs.enqueue(tasks.add.module_path, payload, max_attempts=1)
    goods = [tasks.add.enqueue(1, n).id for n in range(3)]
    with caplog.at_level(logging.ERROR, logger="jobs.tasks"):
        runner.drain()
        assert wait_for_finished_notices(10)
        assert Job.objects.get(pk=bad.pk).state == "failed"
        assert {r.id for name, _, r in heard if name == "finished"} == set(goods)
        heard.clear()
        _send_finished([bad.pk, *map(int, goods)])  # the bad row first in one batch

    assert [r.id for name, _, r in heard if name == "finished"] == goods
    refused = [r.getMessage() for r in caplog.records if f"job {bad.pk} " in r.getMessage()]
    assert refused and all("is not a well-formed task" in m for m in refused), refused
    assert "jobs.tasks.results.MalformedTask" in Job.objects.get(pk=bad.pk).error


@pytest.mark.parametrize(
    "json_text",
    [
        '{"backend": "default", "args": [1, %s]}' % ("9" * 5_001),  # past int_max_str_digits
        '{"backend": "default", "args": [1, 2], "kwargs": {"a": %s}}' % ("[" * 3_000 + "]" * 3_000),
    ],
)
def test_a_task_row_python_cannot_decode_costs_no_other_task_its_task_finished(
    heard, caplog, json_text
):
    """A row written by SQL with JSON the database stores and Python cannot decode (a number of
    5,001 digits, nesting past the recursion limit): the batch's other notices are sent, and
    get_result() says what is wrong with that row rather than raising ValueError/RecursionError."""
    bad = jobs.enqueue(tasks.add.module_path, {"args": [1, 2]}, max_attempts=1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs_job SET payload = %s WHERE id = %s", [json_text, bad.pk])
    goods = [tasks.add.enqueue(1, n).id for n in range(3)]
    runner.drain()
    assert wait_for_finished_notices(10)
    assert Job.objects.filter(pk=bad.pk, state="failed").exists()
    heard.clear()
    with caplog.at_level(logging.ERROR, logger="jobs.tasks"):
        _send_finished([bad.pk, *map(int, goods)])  # the bad row first in one batch
    assert [r.id for name, _, r in heard if name == "finished"] == goods
    refused = [r.getMessage() for r in caplog.records if f"job {bad.pk} " in r.getMessage()]
    assert refused and all("cannot be decoded" in m for m in refused), refused
    with pytest.raises(MalformedTask, match="its payload cannot be decoded"):
        tasks.add.get_result(bad.pk)


@pytest.mark.parametrize("raised", [RuntimeError, SystemExit])
@pytest.mark.parametrize("name", ["enqueued", "started", "finished"])
def test_a_raising_receiver_never_changes_the_outcome(name, raised, heard, caplog):
    """...and is logged once, naming its own signal (a task_enqueued one was logged as a
    task_finished receiver). A SystemExit too (a library calling sys.exit()), which Django's
    send_robust lets through: before, it came out of enqueue(), or failed the task and ended the
    drain, or ended the notice thread unlogged."""

    def bad(sender, **kwargs):
        raise raised(f"receiver of {name} is broken")

    SIGNALS[name].connect(bad, weak=False)
    try:
        with caplog.at_level(logging.ERROR, logger="jobs.tasks"):
            result = tasks.add.enqueue(20, 22)
            runner.drain()
            assert wait_for_finished_notices(10)
    finally:
        SIGNALS[name].disconnect(bad)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        42,
        1,
    )
    assert [n for n, _ in _of(heard, result.id)] == ["enqueued", "started", "finished"]
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.name == "jobs.tasks" and r.levelno >= logging.ERROR
    ]
    assert len(logged) == 1, logged
    assert f"(job {result.id}): a receiver of task_{name} raised" in logged[0]
    assert f"receiver of {name} is broken" in logged[0]


RECEIVER_BLOCKS_SECONDS = 30.0  # the slow receiver's own deadline: far beyond the drain's bound
SLEEPY_SECONDS = 2.0
HEARTBEAT_SECONDS = 0.2


@override_settings(JOBS={"HEARTBEAT_SECONDS": HEARTBEAT_SECONDS})
def test_a_slow_task_finished_receiver_delays_no_commit_and_no_heartbeat(heard):
    """The first task's task_finished receiver blocks for the whole drain: the drain still ends
    at once, both tasks are committed, and the second task -- running meanwhile -- is beaten on
    time; released, the receiver lets both notices through."""
    entered, release = threading.Event(), threading.Event()

    def slow(sender, task_result, **kwargs):
        entered.set()
        release.wait(RECEIVER_BLOCKS_SECONDS)

    task_finished.connect(slow, weak=False)
    try:
        first = tasks.add.enqueue(1, 2)
        second = tasks.sleepy.enqueue(seconds_by_attempt={"1": SLEEPY_SECONDS})
        started = time.monotonic()
        assert runner.drain() == 2
        took = time.monotonic() - started
        assert entered.wait(10)  # the receiver holds the first notice...
        assert not release.is_set()  # ...and still does
        assert took < SLEEPY_SECONDS + 5, f"the drain waited for the receiver: {took:.1f} s"
        assert {j.state for j in Job.objects.filter(pk__in=[int(first.id), int(second.id)])} == {
            "succeeded"
        }
        beaten = Attempt.objects.get(job_id=int(second.id), number=1)
        assert beaten.heartbeat_gap_max is not None, "the running task was never beaten"
        assert beaten.heartbeat_gap_max < SLEEPY_SECONDS / 2, beaten.heartbeat_gap_max
        # The second task's notice waits behind the held one (one thread sends them in order).
        assert [n for n, _ in _of(heard, second.id)] == ["enqueued", "started"]
    finally:
        release.set()
        task_finished.disconnect(slow)
    assert wait_for_finished_notices(10)
    assert _of(heard, first.id)[-1] == ("finished", TaskResultStatus.SUCCESSFUL)
    assert _of(heard, second.id)[-1] == ("finished", TaskResultStatus.SUCCESSFUL)
