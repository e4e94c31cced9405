"""The rescuer: a worker process that died holding jobs hands them back at once.

Owns: in qcluster's main process, the worker processes seen dead (jobs.worker.watchdog looks at
them every LOOK_SECONDS: gone, or exited and not yet reaped) and, for each, reclaiming the jobs
whose attempts it still held (jobs.worker.reaper.rescue), so a worker SIGKILLed by the kernel's
OOM killer, an operator's kill -9, or the watchdog itself has its jobs run again within a look
instead of after their whole lease. Each reclaim is the reaper's compare-and-set with one guard
changed: instead of a lease that ran out, the job's current attempt must still be open on that
worker ("<hostname>:<pid>") and have been claimed before the process was seen dead -- decided by
the database in the statement that writes, so a job committed, failed, released or reclaimed
meanwhile is untouched. It is recorded like any reclaim: the attempt ends `expired`, an
`expired` event (its data says `worker_exited`) and the reclaim's log line. A job it fails (no
attempt left) has its kind's on_finished hook told on a thread of ours (`tell_later`), never the
watchdog's: a hook that blocks or raises stays with its own job.

Never: rescues a pid that a live process holds (the watchdog's `_dead` asks the kernel: no such
process, or our own exited child not yet reaped); an attempt claimed after the pid was seen dead
(a new process that reused the pid) fails the guard. A pid seen dead again before its rescue ran
is fenced on its latest death: no process had that pid then, so every attempt claimed under it
before then is a dead process's. A rescue the database cannot take now (an outage) is tried
again at each look for RETRY_SECONDS; after that the leases decide, as before.
"""

import logging
import os
import socket
import threading
import time
from collections import deque

from django.db import DatabaseError, connection

from jobs.core import registry
from jobs.core.connectivity import bounded
from jobs.core.identity import owner_of
from jobs.worker import reaper

logger = logging.getLogger("jobs.reaper")

RETRY_SECONDS = 60.0
HOOK_THREADS = 4  # threads telling on_finished hooks at once; more hooks wait their turn

_pending: dict[int, float] = {}  # pid -> time.monotonic() at which it was last seen dead


def exited(pid: int, seen_at: float) -> None:
    """Worker process `pid` was seen dead at `seen_at` (time.monotonic()).

    A pid seen dead again before its rescue ran (it was reused -- django-q2's replacement can get
    the same pid -- and that process died too, while the database was out) is fenced on its
    latest death: every attempt claimed under that identity before then belongs to a process
    now dead, the first one's included, and the replacement's must not wait out its lease.
    """
    _pending[pid] = max(seen_at, _pending.get(pid, seen_at))


def pending() -> bool:
    return bool(_pending)


def run() -> int:
    """Reclaim the jobs of every worker seen dead; return how many were reclaimed."""
    me = f"{socket.gethostname()}:{os.getpid()}:rescue"
    total = 0
    for pid, seen_at in list(_pending.items()):
        owner = owner_of(pid)  # as jobs.worker.runner.worker_identity
        try:
            with bounded("rescue of an exited worker's jobs"):
                count = reaper.rescue(owner, seen_at, me, tell=tell_later)
        except DatabaseError as exc:
            connection.close()
            if time.monotonic() - seen_at < RETRY_SECONDS:
                continue
            logger.warning("worker %s exited; its jobs are left to their leases: %s", pid, exc)
            count = 0
        if _pending.get(pid) == seen_at:  # not seen dead again meanwhile: that death is next
            del _pending[pid]
        if count:
            logger.warning(
                "worker process %s exited holding %s job(s): handed back at once", pid, count
            )
        total += count
    return total


# The jobs a rescue failed whose kind's hook is still to hear of it, and how many threads tell.
_told: deque[tuple[str, int, int]] = deque()
_tellers = [0]
_tell_lock = threading.Lock()


def tell_later(kind: str, job_id: int, attempt: int) -> None:
    """A rescue failed the job (its last attempt): its kind's on_finished hook -- user code --
    hears of it on a thread of its own, never the watchdog's: a hook that blocks or raises
    (SystemExit too) would hold up, or end, the looks, kills and rescues of every worker. At
    most HOOK_THREADS hooks run at once; beyond that they wait (one hook that never returns
    delays no other job's while a thread is free)."""
    with _tell_lock:
        _told.append((kind, job_id, attempt))
        if _tellers[0] >= HOOK_THREADS:
            logger.warning(
                "job %s: its on_finished hook waits: %s hooks of rescued jobs are still running",
                job_id,
                HOOK_THREADS,
            )
            return
        _tellers[0] += 1
    try:
        threading.Thread(target=_tell, name="jobs-rescue-finished", daemon=True).start()
    except RuntimeError:  # no thread to be had (a limit, the interpreter ending): the next one
        with _tell_lock:
            _tellers[0] -= 1
        logger.exception("job %s: no thread to tell its on_finished hook yet", job_id)


def _tell() -> None:
    try:
        while True:
            with _tell_lock:
                if not _told:
                    _tellers[0] -= 1
                    return
                kind, job_id, attempt = _told.popleft()
            try:
                registry.finished(kind, job_id, attempt, False)
            except BaseException:  # noqa: BLE001  SystemExit too: the failure has landed
                logger.exception("job %s attempt %s: the on_finished hook failed", job_id, attempt)
    finally:
        connection.close()  # a hook's queries used this thread's own connection
