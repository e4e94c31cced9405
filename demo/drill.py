"""The zombie drill: stage a real zombie on the local cluster and let the fence refuse it.

Owns: enqueueing the drill's slow job, finding the OS process that claimed it (from
`Attempt.worker`, "<hostname>:<pid>"), SIGSTOPping it past its lease, waiting for another worker to
take the job and commit it, then SIGCONTing the stopped one -- whose stale commit (or heartbeat)
is rejected by the database and recorded in jobs.RejectedWrite.

Never: writes a job row itself (every write is the workers' own fenced write), or signals a process
that is not a local `qcluster` worker. Every wait has a deadline; the stopped process is always
resumed, whatever happens (a `finally`).

Hazards: a cluster with a single worker cannot take the job while the other is stopped; the drill
then times out, resumes the worker and reports it. The worker is stopped while its handler sleeps
and before its first background heartbeat, so once resumed the handler returns at once and its
commit is usually the first stale write (see tests/acceptance/cluster.py for the same reasoning).
"""

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.db import close_old_connections, transaction

import jobs
from demo.handlers import DRILL_KIND, DRILL_LEASE_SECONDS
from demo.tasks import drill as drill_task
from jobs.core.identity import owner_of
from jobs.models import Attempt, Job, RejectedWrite

logger = logging.getLogger("demo.drill")

POLL_SECONDS = 0.01  # how often a deadline-bound wait re-reads the database
DRILL_KEY = "demo.drill"  # the drill job's unique_key: one live drill job in the database
_running = threading.Lock()  # one drill at a time per process
_starting = threading.Lock()  # presses in this process decide one at a time
_current: int | None = None  # the job of the drill this process runs


class DrillError(RuntimeError):
    """The drill could not stage its zombie (no local worker, no second worker, ...)."""


@dataclass(frozen=True)
class DrillResult:
    job_id: int
    zombie_pid: int
    rejected_write: str  # which write of attempt 1 the database refused


def _wait[T](probe: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DrillError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(POLL_SECONDS)  # poll interval of a deadline-bound wait


def local_worker_pid(worker: str) -> int:
    """The pid in the worker's identity ("<hostname>:<pid>"; in a pid namespace of its own,
    "<hostname>/<namespace>:<pid>": jobs.core.identity.owner_of) -- only for a live qcluster
    process of this host and pid namespace."""
    _, _, pid_text = worker.rpartition(":")
    if not (pid_text.isascii() and pid_text.isdigit()) or worker != owner_of(int(pid_text)):
        raise DrillError(f"worker {worker!r} is not a process on this host")
    pid = int(pid_text)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError as exc:
        raise DrillError(f"worker process {pid} is gone") from exc
    if b"qcluster" not in cmdline:
        raise DrillError(f"process {pid} is not a qcluster worker")
    return pid


def _sleeping(pid: int) -> bool:
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except FileNotFoundError:
        return False


def enqueue_drill_job(seconds: float = 3.0) -> Job:
    """The slow job, ahead of everything queued so the drill starts at once. While a drill job is
    queued or running it is returned instead (`job.duplicate`), and nothing is enqueued."""
    with transaction.atomic():
        return jobs.enqueue(
            DRILL_KIND,
            {"seconds": seconds, "drill": True},
            priority=100,
            lease_seconds=DRILL_LEASE_SECONDS,
            unique_key=DRILL_KEY,
        )


def enqueue_drill_task(seconds: float = 3.0) -> Job:
    """The same slow work as a django.tasks `@task` (demo.tasks.drill): the drill then shows the
    fence refusing a task's stale commit, by the task's module path."""
    with transaction.atomic():
        result = drill_task.enqueue(seconds=seconds)
    return Job.objects.get(pk=int(result.id))


def start_in_background() -> tuple[int, bool]:
    """(job id, True) for a drill started now; (the running drill's job, False) while a drill
    runs -- in this process, or a drill job is live in the database -- and nothing is enqueued."""
    with _starting:
        if _running.locked() and _current is not None:
            return _current, False
        job = enqueue_drill_job()
        if getattr(job, "duplicate", False):
            return job.pk, False
        return job.pk, run_in_background(job.pk)


def run(job_id: int, timeout: float = 60.0) -> DrillResult:
    """Stop attempt 1's worker, wait for attempt 2 to commit, resume the zombie, see it refused."""
    first = _wait(
        lambda: Attempt.objects.filter(job_id=job_id, number=1).first(),
        timeout,
        "a worker to claim the drill job (is qcluster running?)",
    )
    pid = local_worker_pid(first.worker)
    _wait(lambda: _sleeping(pid), 10, f"worker {pid} to be inside the drill handler")
    os.kill(pid, signal.SIGSTOP)
    logger.info("drill: job %s attempt 1, worker %s stopped", job_id, pid)
    try:
        _wait(
            lambda: Job.objects.filter(pk=job_id, attempt__gte=2, state="succeeded").exists(),
            timeout,
            "another worker to reclaim and commit the job (needs JOBS_WORKERS >= 2)",
        )
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
            logger.info("drill: job %s, worker %s resumed", job_id, pid)
        except ProcessLookupError:  # its cluster killed it meanwhile (stopping, or a watchdog)
            logger.info("drill: job %s, worker %s is gone", job_id, pid)
    rejected = _wait(
        lambda: RejectedWrite.objects.filter(job_id=job_id, attempt_presented=1).first(),
        timeout,
        "the zombie's stale write to be rejected",
    )
    return DrillResult(job_id, pid, rejected.write)


def run_in_background(job_id: int) -> bool:
    """Run the drill for `job_id` in a thread; False if a drill is already running here."""
    global _current
    if not _running.acquire(blocking=False):
        return False
    _current = job_id

    def target() -> None:
        try:
            result = run(job_id)
            logger.info("drill finished: %s", result)
        except DrillError:
            logger.exception("drill for job %s failed", job_id)
        finally:
            close_old_connections()
            _running.release()

    threading.Thread(target=target, name=f"drill-{job_id}", daemon=True).start()
    return True
