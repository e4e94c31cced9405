"""The main process's watchdog kills a worker in which no thread has run past its attempt's
lease, and leaves a stopped one (a zombie drill) alone -- also for a moment after its SIGCONT.
A real child process stands in for the worker; its slot says what a worker's would."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from jobs.worker import watchdog

LEASE = 1.0


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, wanted: set[str]) -> None:
    deadline = time.monotonic() + 5
    while _state(pid) not in wanted:
        assert time.monotonic() < deadline, f"process {pid} never reached {wanted}"
        time.sleep(0.01)  # the poll interval of a deadline-bound wait


@pytest.fixture
def worker() -> Iterator[tuple[subprocess.Popen[bytes], watchdog._Slot]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    slot = watchdog._slots[watchdog.SLOTS - 1]
    now = time.monotonic()
    slot.pid, slot.state, slot.job_id, slot.attempt = proc.pid, watchdog.RUNNING, 7, 1
    slot.lease, slot.pulse, slot.deadline, slot.timeout = LEASE, now, float("inf"), 0.0
    try:
        yield proc, slot
    finally:
        slot.pid, slot.state = 0, watchdog.FREE
        watchdog._resumed[0] = 0.0
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()


def test_a_worker_whose_threads_have_not_run_past_its_lease_is_killed(worker):
    proc, slot = worker
    now = time.monotonic()
    watchdog.look(now + LEASE + watchdog.KILL_MARGIN_SECONDS - 0.5)
    assert proc.poll() is None and slot.pid == proc.pid  # within lease + margin: left alone
    watchdog.look(now + LEASE + watchdog.KILL_MARGIN_SECONDS + 0.5)
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert slot.pid == 0


def test_a_stopped_worker_is_left_alone_and_counts_from_when_it_was_seen_stopped(worker):
    proc, slot = worker
    os.kill(proc.pid, signal.SIGSTOP)
    _wait_state(proc.pid, {"T", "t"})
    later = time.monotonic() + 60  # its pulse is a minute old
    watchdog.look(later)
    assert proc.poll() is None  # stopped: never killed
    os.kill(proc.pid, signal.SIGCONT)  # resumed: its pulse has not come back yet
    _wait_state(proc.pid, {"S", "R"})
    watchdog.look(later + 1.0)
    assert proc.poll() is None and slot.pid == proc.pid
    watchdog.look(later + LEASE + watchdog.KILL_MARGIN_SECONDS + 0.5)  # and still no pulse
    assert proc.wait(timeout=5) == -signal.SIGKILL


def test_a_worker_with_a_recent_pulse_is_left_alone(worker):
    proc, slot = worker
    slot.pulse = time.monotonic() + 60
    watchdog.look(time.monotonic() + 60)
    assert proc.poll() is None and slot.pid == proc.pid


def test_after_a_pause_of_the_main_process_a_worker_counts_from_the_resume(worker):
    # The whole cluster was stopped (a suspended VM, docker pause, a SIGSTOP of the group) and
    # resumed: the main process's first look finds the worker running with a stale pulse, but
    # it was paused itself and could not have seen a pulse. Before: killed at once.
    proc, slot = worker
    now = time.monotonic()
    later = now + 60  # the main process's previous look, and the worker's pulse, a minute old
    watchdog.tick(now, later)
    assert proc.poll() is None and slot.pid == proc.pid
    edge = later + LEASE + watchdog.KILL_MARGIN_SECONDS  # looks every LOOK_SECONDS from then on
    watchdog.tick(edge - 0.5 - watchdog.LOOK_SECONDS, edge - 0.5)
    assert proc.poll() is None and slot.pid == proc.pid
    watchdog.tick(edge + 0.5 - watchdog.LOOK_SECONDS, edge + 0.5)  # and still no pulse
    assert proc.wait(timeout=5) == -signal.SIGKILL


def test_a_deadline_passed_during_a_pause_of_the_main_process_is_given_the_margin(worker):
    proc, slot = worker
    now = time.monotonic()
    slot.deadline, slot.timeout, slot.pulse = now + 1.0, 1.0, now + 60
    watchdog.tick(now, now + 60)  # past deadline + margin, but only seen after a pause
    assert proc.poll() is None and slot.pid == proc.pid
    edge = now + 60 + watchdog.KILL_MARGIN_SECONDS
    watchdog.tick(edge - 0.5 - watchdog.LOOK_SECONDS, edge - 0.5)
    assert proc.poll() is None and slot.pid == proc.pid
    watchdog.tick(edge + 0.5 - watchdog.LOOK_SECONDS, edge + 0.5)
    assert proc.wait(timeout=5) == -signal.SIGKILL
