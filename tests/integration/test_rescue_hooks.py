"""A terminal rescue (jobs.worker.rescue: a dead worker process's job that had no attempt left,
failed at once) tells the kind's on_finished hook -- user code -- off the watchdog's thread. It
ran on that thread: a hook that blocked held up every later rescue and the watchdog's kills and
timeout reports for all jobs, and one that raised SystemExit ended the thread for good. The real
watchdog thread and real reclaims on PostgreSQL; only the dead workers are identities planted
in attempt rows."""

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest
from django.db import DatabaseError, connection

from jobs.core.identity import owner_of
from jobs.core.registry import _handlers
from jobs.core.states import JobState
from jobs.models import Job
from jobs.worker import bridge, reaper, rescue, scheduler, watchdog

pytestmark = pytest.mark.django_db(transaction=True)

BLOCKS, EXITS, HEARS = 4242, 4243, 4244  # the dead worker processes' pids


@dataclass
class Hook:
    """test.echo's hook: blocks (until released) for the job of worker BLOCKS, raises SystemExit
    for the job of worker EXITS, and hears every job it returns for."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    heard: list[int] = field(default_factory=list)
    pid_of: dict[int, int] = field(default_factory=dict)  # job -> its dead worker's pid

    def __call__(self, job_id: int, attempt: int, succeeded: bool) -> None:
        if self.pid_of[job_id] == BLOCKS:
            self.entered.set()
            self.release.wait(30)
        elif self.pid_of[job_id] == EXITS:
            raise SystemExit(0)  # a library calling sys.exit()
        self.heard.append(job_id)


@pytest.fixture
def hook(monkeypatch) -> Iterator[Hook]:
    told = Hook()
    monkeypatch.setitem(_handlers, "test.echo", replace(_handlers["test.echo"], on_finished=told))
    monkeypatch.setattr(rescue, "_pending", {})
    try:
        yield told
    finally:
        told.release.set()


def _wait(what: str, done: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.02)  # the poll interval of a deadline-bound wait


def _failed(job_id: int) -> Callable[[], bool]:
    return lambda: Job.objects.get(pk=job_id).state == JobState.FAILED


def test_a_hook_that_blocks_or_raises_system_exit_stops_no_later_rescue(hook, make_job):
    job_of = {}
    for pid in (BLOCKS, EXITS, HEARS):  # each on its last attempt, confirmed running: terminal
        job = make_job(state=JobState.RUNNING, attempt=1, worker=owner_of(pid), max_attempts=1)
        job_of[pid], hook.pid_of[job.pk] = job.pk, pid
    dog = watchdog.Watchdog()
    dog.start()
    try:
        rescue.exited(BLOCKS, time.monotonic())
        _wait("the first job failed", _failed(job_of[BLOCKS]))
        _wait("its hook runs (and blocks)", hook.entered.is_set)
        rescue.exited(EXITS, time.monotonic())  # the watchdog must still look and rescue
        _wait("a second rescue while the first hook blocks", _failed(job_of[EXITS]))
        rescue.exited(HEARS, time.monotonic())  # and after a hook raised SystemExit, too
        _wait("a third rescue, its hook told", lambda: hook.heard == [job_of[HEARS]])
        assert dog._thread.is_alive()
        hook.release.set()
        _wait("the blocked hook ends", lambda: job_of[BLOCKS] in hook.heard)
    finally:
        hook.release.set()
        dog.stop()


def test_a_scheduler_tick_that_reaps_waits_for_no_hook_and_survives_system_exit(
    hook, make_job, monkeypatch
):
    """The lease reaper runs in the scheduler's tick: a terminal reclaim's hook -- one that
    blocks, one that raises SystemExit -- runs off that thread, so the tick returns (and the
    next one comes) whatever the hook does. Only django-q2's transport is stood in for: the
    tick's dispatch asks it for drains."""
    monkeypatch.setattr(bridge, "new_broker", lambda: object())
    monkeypatch.setattr(bridge, "worker_count", lambda: 1)
    monkeypatch.setattr(bridge, "pending_drains", lambda broker: 1)  # a drain stands: none sent
    job_of = {}
    for pid in (BLOCKS, EXITS):  # expired on their last, confirmed attempt: failed by the reaper
        job = make_job(
            state=JobState.RUNNING, attempt=1, worker=owner_of(pid), max_attempts=1, lease_in=-5
        )
        job_of[pid], hook.pid_of[job.pk] = job.pk, pid
    sched = scheduler.EmbeddedScheduler()
    done = threading.Event()

    def tick() -> None:
        try:
            sched.tick()
            done.set()
        finally:
            connection.close()  # this thread's own

    threading.Thread(target=tick, daemon=True).start()
    _wait("the tick returned while a hook blocks", done.is_set)
    assert all(_failed(job_id)() for job_id in job_of.values())
    _wait("the blocking hook runs", hook.entered.is_set)
    hook.release.set()
    _wait("the blocked hook ends", lambda: job_of[BLOCKS] in hook.heard)


def test_a_hook_that_breaks_its_connection_fails_no_later_hook_on_its_thread(monkeypatch):
    """The hook threads tell one hook after another, each on the thread's own connection: a
    hook that lost it (here its server process is terminated, as a database restart does) left
    it broken for the next hook told on that thread, which failed ("connection already closed")
    for a fault that was not its own."""
    monkeypatch.setattr(reaper, "HOOK_THREADS", 1)  # both hooks on the one thread, in turn
    entered, release, heard = threading.Event(), threading.Event(), {}

    def told(job_id: int, attempt: int, succeeded: bool) -> None:
        if job_id == 1:
            entered.set()
            release.wait(30)
            with pytest.raises(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            heard[job_id] = "broken"
            return
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                heard[job_id] = cursor.fetchone()
        except DatabaseError as exc:
            heard[job_id] = exc

    monkeypatch.setitem(_handlers, "test.echo", replace(_handlers["test.echo"], on_finished=told))
    try:
        reaper.tell_later("test.echo", 1, 1)
        _wait("the first hook runs", entered.is_set)
        reaper.tell_later("test.echo", 2, 1)  # waits for the one thread
    finally:
        release.set()
    _wait("the second hook is told", lambda: 2 in heard)
    assert heard == {1: "broken", 2: (1,)}


def test_a_hook_thread_that_cannot_start_gives_its_slot_back(monkeypatch):
    """A thread that cannot be started (here MemoryError) kept its slot: the reclaim saw the
    error, and after HOOK_THREADS such failures no hook was ever told again. Now its job's hook
    waits in the queue and the next thread that starts tells it."""
    heard: list[int] = []

    def told(job_id: int, attempt: int, succeeded: bool) -> None:
        heard.append(job_id)

    class NoThread:
        def __init__(self, **kwargs) -> None:
            pass

        def start(self) -> None:
            raise MemoryError

    monkeypatch.setitem(_handlers, "test.echo", replace(_handlers["test.echo"], on_finished=told))
    monkeypatch.setattr(reaper, "_tellers", [0])
    monkeypatch.setattr(reaper, "_told", reaper.deque())
    monkeypatch.setattr(reaper, "threading", SimpleNamespace(Thread=NoThread))
    for job_id in range(1, reaper.HOOK_THREADS + 2):
        reaper.tell_later("test.echo", job_id, 1)  # no thread: nothing raised, nothing told
    assert reaper._tellers == [0] and heard == []
    monkeypatch.setattr(reaper, "threading", threading)
    reaper.tell_later("test.echo", 99, 1)
    _wait("every waiting hook told", lambda: len(heard) == reaper.HOOK_THREADS + 2)
    assert heard == [*range(1, reaper.HOOK_THREADS + 2), 99]
