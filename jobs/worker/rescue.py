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
attempt left) has its kind's on_finished hook told on a thread of ours (`reaper.tell_later`),
never the watchdog's: a hook that blocks or raises stays with its own job.

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
import time

from django.db import DatabaseError, connection

from jobs.core.connectivity import bounded
from jobs.core.identity import owner_of
from jobs.worker import reaper

logger = logging.getLogger("jobs.reaper")

RETRY_SECONDS = 60.0

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
                count = reaper.rescue(owner, seen_at, me, tell=reaper.tell_later)
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
