"""The shutdown policy shared by qcluster's main process and its django-q2 worker processes.

Owns: one moment, in memory shared across the fork of the cluster, at which the grace period of
a stop ends. The main process sets it when SIGTERM/SIGINT arrives (`begin`); from then on a drain
claims nothing more and hands back jobs it holds but has not started (`requested`); a handler
still running when the grace ends is abandoned: its job is handed back by a fenced release and
its worker process exits (`grace_over`, acted on by the drain's background thread in
jobs.worker.runner). The main process kills whatever is left shortly after (management command).

Never: decides a job's fate. The release is a compare-and-set like every other write, so a
handler that finished a moment earlier keeps its commit, and an abandoned handler's later writes
change zero rows and are recorded as stale.

A SIGTERM to the whole process group (systemd's default KillMode=control-group) also reaches the
worker processes: `worker_sigterm` (installed in each django-q2 worker when it spawns) starts the
same grace period for that process alone, ends an idle worker at once, and lets a draining one
finish its drain (then it exits: the sentinel died of the same signal, so no stop message will
ever come). A SIGTERM to one worker only never stops the others (it used to start the
cluster-wide grace: a worker terminated for a timeout froze every drain of the cluster).

Hazards: the shared value must exist before django-q2 forks (importing this module creates it;
the qcluster command imports it before starting the cluster). It is compared with
time.monotonic(), which is one clock for every process on the host (Linux CLOCK_MONOTONIC).
"""

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from jobs.core.conf import jobs_settings

logger = logging.getLogger("jobs.runner")

# When a worker process exits (django-q2 recycles it, a stop), how long it waits for the
# non-daemon threads its handlers left running before it leaves without them: more than the
# platform's own exit work takes (jobs.core.registry.EXIT_HOOK_SECONDS).
EXIT_THREADS_SECONDS = 5.0
# The exit status of a worker process that left without such threads: not 0, so whatever reads
# its status (a process monitor, a test, multiprocessing's exitcode) sees that it did not end
# cleanly; the error line names the threads (django-q2's sentinel only logs the replacement).
EXIT_LEAKED_THREADS = 3

# 0.0: no stop requested; otherwise the time.monotonic() at which the grace period ends.
_grace_ends_at = multiprocessing.RawValue("d", 0.0)


# This process alone (a worker sent SIGTERM by itself): the same policy, for this process only.
_own_grace_ends_at = {"value": 0.0}


def begin(grace_seconds: float) -> float:
    """Start the grace period (once: a second signal does not extend it); return its end."""
    if _grace_ends_at.value == 0.0:
        _grace_ends_at.value = time.monotonic() + grace_seconds
    return float(_grace_ends_at.value)


def _ends() -> list[float]:
    return [v for v in (_grace_ends_at.value, _own_grace_ends_at["value"]) if v != 0.0]


def requested() -> bool:
    """A stop was requested (of the cluster, or of this worker process): claim nothing more.
    (Asked before each job a drain starts: no list made.)"""
    return _grace_ends_at.value != 0.0 or _own_grace_ends_at["value"] != 0.0


def grace_ends_at() -> float | None:
    """time.monotonic() at which the grace of a requested stop ends; None: no stop."""
    ends = _ends()
    return min(ends) if ends else None


def grace_over() -> bool:
    """The grace period has ended: hand back what is still held and exit."""
    ends = _ends()
    return bool(ends) and time.monotonic() >= min(ends)


def reset() -> None:
    """For tests running drains in-process."""
    _grace_ends_at.value = 0.0
    _own_grace_ends_at["value"] = 0.0


# Per process: is a drain running in this worker, and has this worker been sent SIGTERM?
_worker = {"draining": False, "terminated": False}


@contextmanager
def draining() -> Iterator[None]:
    _worker["draining"] = True
    try:
        yield
    finally:
        _worker["draining"] = False


def terminated() -> bool:
    """This worker process was sent SIGTERM itself: leave once the drain is over."""
    return _worker["terminated"]


def worker_sigterm(signum: int, frame: FrameType | None) -> None:
    # This process's grace, never the cluster's: a SIGTERM sent to one worker (an operator, a
    # supervisor's guard) stops that worker alone. A stop of the whole group also reaches
    # qcluster's main process, which starts the cluster's grace itself.
    if _own_grace_ends_at["value"] == 0.0:
        _own_grace_ends_at["value"] = time.monotonic() + jobs_settings().SHUTDOWN_GRACE_SECONDS
    _worker["terminated"] = True
    if not _worker["draining"]:
        raise SystemExit(0)  # idle (waiting for a task): nothing to finish


def install_worker_handler(sender: object, **kwargs: object) -> None:
    """django-q2's post_spawn, in each new worker process (its main thread)."""
    signal.signal(signal.SIGTERM, worker_sigterm)
    # Run by the process's exit before Python joins its non-daemon threads (the hook
    # concurrent.futures uses): not public API, hence looked up.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_exit_without_leaked_threads)


def _exit_without_leaked_threads() -> None:
    """A worker process is exiting: a non-daemon thread a handler left running would hold it
    alive forever (Python's exit joins them), and django-q2 replaces a worker only once it is
    gone -- a recycled worker stayed alive and idle for good, the cluster one worker short.
    The exit goes on as usual (the platform's own non-daemon thread, jobs.tasks' notices sent at
    exit, finishes within its bound); a daemonic thread ends the process EXIT_THREADS_SECONDS
    later if it is still there (what such threads owed belongs to attempts already ended), with
    status EXIT_LEAKED_THREADS: an exit that abandoned running code is not a clean one."""
    threading.Thread(target=_leave_later, name="jobs-exit-guard", daemon=True).start()


def _leave_later() -> None:
    time.sleep(EXIT_THREADS_SECONDS)  # the process normally ends meanwhile, and this with it
    left = [t.name for t in threading.enumerate() if not t.daemon and t.is_alive()]
    logger.error(
        "worker process %s exits with status %s, %.0f s after its exit began, without %s "
        "non-daemon thread(s) a handler left running: %s",
        os.getpid(),
        EXIT_LEAKED_THREADS,
        EXIT_THREADS_SECONDS,
        len(left),
        ", ".join(left[:5]),
    )
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(EXIT_LEAKED_THREADS)
