"""The execution timeout: what each worker runs, shared with qcluster's main process.

Owns: a table in shared memory (created on import, before django-q2 forks, like
jobs.worker.shutdown's grace) with one slot per worker process: its pid, the job and attempt its
handler runs, and when that attempt's timeout (`@handler(timeout=...)`, else django-q2's
Q_TIMEOUT) runs out. The drain fills its slot when a handler starts and empties it when the
handler returns. At the deadline the drain's background thread fails the attempt itself
("exceeded the task timeout of N s", retried like any failure; unless the handler returned
first, decided once under the drain's lock: jobs.worker.running), hands its batch-mates back,
runs the exit hooks (jobs.core.registry: jobs.tasks sends the task_finished notices those writes
queued, bounded by EXIT_HOOK_SECONDS; os._exit would kill their thread first), and ends the
worker process, which django-q2's sentinel replaces (jobs.worker.runner). `Watchdog`, a thread
of qcluster's main process, logs every worker that timed out, and SIGKILLs one still alive
KILL_MARGIN_SECONDS after its deadline (or after its settling budget): a handler stuck in C code
that holds the GIL, so that no thread of its process can run. Every worker it sees dead --
killed by it, by the OOM killer or by an operator -- goes to jobs.worker.rescue, which reclaims
the jobs it held at once, as the reaper would once their leases ran out (charged alike).

Never: writes to the database except through jobs.worker.completer (`time_out`: the overrun
attempt's fenced fail, its batch-mates' fenced releases) and, on the main process's thread,
jobs.worker.rescue (a dead worker's reclaims), and never touches another worker's
job: a timeout ends only the process that overran. It never starts the cluster's shutdown grace
(a stop of one worker is not a stop of the cluster).

Hazards: the table is written without a lock except to claim a slot (a process killed inside
that short critical section would leave the lock held: claiming gives up after a second and the
worker runs without a watchdog, logged). A pid is SIGKILLed only while it is in the main
process's own process group, so a pid reused by another program after the worker died is never
hit. Deadlines compare time.monotonic(), one clock for every process on the host (Linux).
"""

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time

from django.db import connection

from jobs.context import Held
from jobs.core import registry
from jobs.core.conf import jobs_settings
from jobs.core.transitions import Claimed, Fence
from jobs.worker import completer, rescue
from jobs.worker.heartbeat import Heartbeater

logger = logging.getLogger("jobs.runner")

SLOTS = 256  # more worker processes than this run without a watchdog (logged)
KILL_MARGIN_SECONDS = 5.0  # past the deadline, the settling budget or the lease: a SIGKILL
LOOK_SECONDS = 0.25  # how often the main process looks
PULSE_SECONDS = 0.5  # how often a worker's pulse thread says that its threads can run
# A gap this long between two looks: the main process itself was paused (the whole cluster
# stopped and resumed, a suspended VM, `docker pause`) or starved, and saw no pulse meanwhile.
BLIND_SECONDS = 1.0

FREE, IDLE, RUNNING, SETTLING, TIMED_OUT = 0, 1, 2, 3, 4


class _Slot(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_int),
        ("state", ctypes.c_int),
        ("job_id", ctypes.c_longlong),
        ("attempt", ctypes.c_int),
        ("timeout", ctypes.c_double),
        ("deadline", ctypes.c_double),  # time.monotonic() at which RUNNING/SETTLING overruns
        ("lease", ctypes.c_double),  # the running attempt's lease (RUNNING), in seconds
        ("pulse", ctypes.c_double),  # time.monotonic() when a thread of the worker last ran
    ]


_slots = multiprocessing.RawArray(_Slot, SLOTS)
_claim_lock = multiprocessing.Lock()
# This process's slot (its view made once: indexing the array makes one, a microsecond a job)
# and pid, once claimed; a fork's child has none (a pid per job without os.getpid()'s syscall).
_mine: dict[str, "_Slot | int"] = {}
os.register_at_fork(after_in_child=_mine.clear)


def claim_slot(sender: object = None, **kwargs: object) -> None:
    """django-q2's post_spawn, in each new worker process: take a free slot."""
    if not _claim_lock.acquire(timeout=1.0):
        logger.warning("worker %s runs without a timeout watchdog (slot table locked)", os.getpid())
        return
    try:
        # A free slot first: one whose worker died is left to the main process for a moment
        # (it rescues that worker's jobs: jobs.worker.rescue), then reused.
        free = [i for i, slot in enumerate(_slots) if slot.pid == 0]
        for i in free or range(SLOTS):
            slot = _slots[i]
            # Free, or its worker died unnoticed -- but not one whose timeout the main process
            # has yet to report (a replacement spawned at once would erase it).
            if slot.pid == 0 or (slot.state != TIMED_OUT and not _alive(slot.pid)):
                slot.state, slot.job_id, slot.attempt = IDLE, 0, 0
                slot.pulse = time.monotonic()
                slot.pid = os.getpid()
                _mine["slot"], _mine["pid"] = slot, slot.pid
                threading.Thread(
                    target=_pulse, args=(slot,), name="jobs-pulse", daemon=True
                ).start()
                return
    finally:
        _claim_lock.release()
    logger.warning("worker %s runs without a timeout watchdog (all slots taken)", os.getpid())


def _slot() -> _Slot | None:
    slot = _mine.get("slot")
    if not isinstance(slot, _Slot) or slot.pid != _mine["pid"]:
        return None  # not a django-q2 worker (a drain run in-process), or no slot
    return slot


def _pulse(slot: _Slot) -> None:
    """A worker's thread that only says it can run: when it cannot for longer than the running
    attempt's lease, no thread of the process can (a handler holds the GIL in C code)."""
    pid = os.getpid()
    while slot.pid == pid:
        slot.pulse = time.monotonic()
        time.sleep(PULSE_SECONDS)  # a pulse, not a wait for a condition


def started(
    job_id: int, attempt: int, timeout: float | None, lease: float, now: float | None = None
) -> None:
    """A handler starts (at `now`, time.monotonic(), if read): it overruns at now + timeout
    (None: never); its lease is `lease`."""
    slot = _slot()
    if slot is not None:
        slot.job_id, slot.attempt, slot.timeout = job_id, attempt, timeout or 0.0
        now = time.monotonic() if now is None else now
        slot.deadline = now + timeout if timeout is not None else float("inf")
        slot.lease = lease
        slot.state = RUNNING


def ended() -> None:
    """The handler returned in time."""
    slot = _slot()
    if slot is not None and slot.state == RUNNING:
        slot.state = IDLE


def settling(budget: float) -> None:
    """The background thread is failing the overrun attempt: allow it `budget` seconds."""
    slot = _slot()
    if slot is not None:
        slot.deadline = time.monotonic() + budget
        slot.state = SETTLING


def timed_out() -> None:
    """The overrun attempt is settled; this process exits now (the main process logs it)."""
    slot = _slot()
    if slot is not None:
        slot.state = TIMED_OUT


def time_out(beats: Heartbeater, claimed: Claimed, held: Held, seconds: float) -> None:
    """On the drain's background thread: the running handler overran its timeout.

    Its attempt fails with its own error (retried like any failure), the batch's finished
    successes commit and its unstarted jobs go back; the task_finished notices these final
    writes queued are sent (bounded: a stuck receiver delays the exit by EXIT_HOOK_SECONDS at
    most); then this worker process ends -- the handler cannot be interrupted safely (it may be
    inside C code) -- and django-q2 replaces it. Nothing here stops any other worker: no
    shutdown grace begins.
    """
    fence, cfg = claimed.fence, jobs_settings()
    if not beats.take_timed_out(held):
        return  # the handler returned first (decided under the drain's lock): the runner ends it
    error = f"exceeded the task timeout of {seconds:g} s"
    settling(cfg.UNKNOWN_OUTCOME_SECONDS + 2 * cfg.DB_TIMEOUT_SECONDS + registry.EXIT_HOOK_SECONDS)
    logger.error(
        "job %s (%s) attempt %s %s: failing it; worker process %s exits and is replaced",
        fence.job_id,
        claimed.kind,
        fence.attempt,
        error,
        os.getpid(),
    )

    def hand_back_unstarted() -> None:
        for h in beats.take_unstarted():
            completer.hand_back(h.fence, "(a batch-mate timed out)", logging.INFO)

    for step in (
        beats.flush,
        hand_back_unstarted,
        lambda: completer.fail(claimed, error, held=held),
    ):
        try:
            step()
        except Exception:  # noqa: BLE001  best effort: what is not settled here, its lease decides
            logger.exception("job %s attempt %s: could not settle part of a timeout", *_ids(fence))
    # os._exit skips what daemonic threads still owe: jobs.tasks' notices of the fail (and of
    # the batch's commits) -- the failure that ends a task must be announced.
    registry.before_exit()
    timed_out()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(1)


def _ids(fence: Fence) -> tuple[int, int]:
    return fence.job_id, fence.attempt


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ours(pid: int) -> bool:
    try:
        return os.getpgid(pid) == os.getpgrp()
    except ProcessLookupError:
        return False


def live_workers() -> set[int]:
    """In the main process: the worker processes (with a slot) still running, zombies not."""
    return {slot.pid for slot in _slots if slot.pid and _ours(slot.pid) and _state(slot.pid) != "Z"}


def _state(pid: int) -> str:
    """The process's state letter in /proc ("R", "S", "D", "T" stopped, "Z" exited), or ""."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


_seen_stopped: dict[int, float] = {}  # pid -> when the main process last saw it stopped
# When the main process last came back from a pause of its own (BLIND_SECONDS without a look):
# every worker counts from then, as from a SIGCONT -- they were most likely paused with it, and
# whether their threads ran meanwhile it could not see.
_resumed = [0.0]


def _since(pid: int, slot: _Slot) -> float:
    """When a thread of the worker was last known able to run (or could have been)."""
    return max(slot.pulse, _seen_stopped.get(pid, 0.0), _resumed[0])


def _frozen(pid: int, slot: _Slot, now: float) -> bool:
    """RUNNING, and no thread of the process has run for longer than its attempt's lease (plus
    the margin): its lease is gone, no write of it can land, and it holds a worker. A stopped
    process is left alone (a zombie drill resumes it), and counts from when it was last seen
    stopped (its pulse needs a moment after a SIGCONT)."""
    state = _state(pid)
    if state in ("T", "t"):  # SIGSTOPped (or traced): not running anything, not holding anything
        _seen_stopped[pid] = now
        return False
    if state in ("Z", ""):
        return False  # exited: the sentinel replaces it
    return slot.lease > 0 and now - _since(pid, slot) > slot.lease + KILL_MARGIN_SECONDS


_killed: set[int] = set()  # workers this watchdog SIGKILLed, watched until they are gone
_noted: set[int] = set()  # workers seen dead and handed to the rescuer


def _dead(pid: int) -> bool:
    """No process has this pid, or it is our exited child not yet reaped (not reusable yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _state(pid) == "Z" and _ours(pid)


def _note_exits(now: float) -> None:
    """Hand every worker seen dead to the rescuer, once (its jobs are reclaimed at once)."""
    pids = {slot.pid for slot in _slots if slot.pid} | _killed
    for pid in pids:
        if not _dead(pid):
            _noted.discard(pid)  # alive (again: a pid reused)
        elif pid not in _noted:
            _noted.add(pid)
            rescue.exited(pid, now)
    _noted.intersection_update(pids)
    _killed.difference_update(_noted)


def look(now: float) -> None:
    """In the main process: log the workers that timed out, kill those stuck past it, or past
    their running attempt's lease with no thread able to run; hand the dead to the rescuer."""
    _note_exits(now)
    for slot in _slots:
        pid, state = slot.pid, slot.state
        if pid == 0:
            continue
        # A deadline passed while the main process itself was paused: the worker's own
        # background thread (paused too) is given the margin from the resume to settle it.
        overrun = now > max(slot.deadline, _resumed[0]) + KILL_MARGIN_SECONDS
        if state == RUNNING and not overrun and _ours(pid):
            if _frozen(pid, slot, now):
                logger.error(
                    "worker %s: no thread of it has run for %.0f s, past the lease of %g s of "
                    "job %s attempt %s (a handler holding the GIL in C code?): killed; its jobs "
                    "are reclaimed",
                    pid,
                    now - _since(pid, slot),
                    slot.lease,
                    slot.job_id,
                    slot.attempt,
                )
                _kill(pid)
                slot.pid = 0
            continue
        if state == TIMED_OUT:
            logger.error(
                "worker %s: job %s attempt %s exceeded the task timeout of %g s; the attempt "
                "failed (retried like any failure, if attempts remain) and django-q2 replaces "
                "the worker",
                pid,
                slot.job_id,
                slot.attempt,
                slot.timeout,
            )
            slot.pid = 0
        elif state in (RUNNING, SETTLING) and overrun:
            if _ours(pid):
                logger.error(
                    "worker %s: job %s attempt %s is still running %.0f s past its task timeout "
                    "of %g s and its process does not answer (stuck in C code?): killed; its "
                    "jobs are reclaimed",
                    pid,
                    slot.job_id,
                    slot.attempt,
                    now - slot.deadline,
                    slot.timeout,
                )
                _kill(pid)
            slot.pid = 0
        elif not _ours(pid):
            _seen_stopped.pop(pid, None)
            if slot.pid == pid:  # gone (killed, recycled): free again, unless just reclaimed
                slot.pid = 0


def _kill(pid: int) -> None:
    _seen_stopped.pop(pid, None)
    _killed.add(pid)  # its slot is freed now: watched until it is gone, then rescued
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Watchdog:
    """The main process's thread that calls `look` every LOOK_SECONDS until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobs-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        last = time.monotonic()
        try:
            while not self._stop.wait(LOOK_SECONDS):
                now = time.monotonic()
                try:
                    tick(last, now)
                    if rescue.pending():
                        rescue.run()
                except Exception:  # noqa: BLE001  the watchdog must outlive any one error
                    logger.exception("timeout watchdog: look failed")
                last = now
        finally:
            connection.close()  # the rescues' connection, this thread's own


def tick(last: float, now: float) -> None:
    """One look at `now`, the previous one at `last`: a gap past BLIND_SECONDS means the main
    process was not running either (paused with its workers): nothing it saw then is evidence."""
    if now - last > BLIND_SECONDS:
        _resumed[0] = now
        logger.info("timeout watchdog: resumed after %.1f s; workers count from now", now - last)
    look(now)
