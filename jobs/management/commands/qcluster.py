"""`manage.py qcluster`: django-q2's workers plus Palisade's embedded scheduler.

django-q2's own command starts the cluster (sentinel, workers, pusher, monitor) in child
processes and returns. This one then runs the embedded scheduler (dispatch + lease reaper) in the
main process until the cluster stops or a stop signal arrives, so one command is all a deployment
needs beside the web server.

Hazard (why stopping is done here, not in django-q2's signal handler): a supervisor that signals
the whole process group (systemd's default KillMode=control-group, a terminal's Ctrl-C) kills the
sentinel at the same moment. If it dies holding its stop event's lock, django-q2's handler blocks
forever in Event.set(). So the signal only asks the scheduler loop to end, and the cluster is
stopped afterwards -- skipped when the sentinel is already gone, and bounded by a deadline.

Shutdown policy (jobs.worker.shutdown): SIGTERM/SIGINT to this process starts the grace period
(JOBS["SHUTDOWN_GRACE_SECONDS"]). Drains claim nothing more at once and hand back what they hold
unstarted; handlers may finish within the grace; then each drain hands its jobs back (fenced
release) and its worker process exits. Whatever is still alive SHUTDOWN_MARGIN_SECONDS after the
grace (a handler stuck in C code, a process blocked on an unreachable database) is SIGKILLed, so
the process group is gone within grace + margin whatever the handlers or the network do. A
signal to the whole group kills the sentinel, but each worker applies the same policy itself
(jobs.worker.shutdown.worker_sigterm); this process then waits for them, and kills what is left of
its group at the same deadline. The
scheduler's own database wait is cut when the signal arrives, so an unreachable database cannot
hold the main process either. Under load django-q2's ordered stop waits for a worker to empty its
full task queue: once the grace is over and no worker is left, its helpers get SIGTERM instead
(`stop_cluster`), and workers orphaned by the sentinel are reaped here (a subreaper), so the group
is gone within about half a second after the grace without a SIGKILL.

Also runs the execution-timeout watchdog (jobs.worker.watchdog) on a thread of this process: it
logs each worker that timed out and kills one stuck in C code past its deadline.
"""

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser
from django.db import connection
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as DjangoQClusterCommand

from jobs.core import registry
from jobs.core.conf import jobs_settings
from jobs.core.connectivity import cut_waits_of_this_thread
from jobs.worker import shutdown, watchdog
from jobs.worker.scheduler import EmbeddedScheduler, limit_statements_of_this_process

logger = logging.getLogger("jobs.scheduler")
# After the grace period: time for drains to hand their jobs back and for processes to exit,
# before whatever is left is killed.
SHUTDOWN_MARGIN_SECONDS = 5.0


class Command(DjangoQClusterCommand):
    help = "Starts django-q2's workers and Palisade's embedded scheduler (dispatch, reaper)."

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="Run workers only (another qcluster runs the scheduler; two are harmless too).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settings.SECRET_KEY  # noqa: B018  (django-q2 signs tasks with it)
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        adopt_orphans()  # before the fork: workers orphaned at a stop are reaped here
        cluster = Cluster()
        cluster.start()
        if options.get("run_once"):
            cluster.stop()
            return
        limit_statements_of_this_process()  # after the fork: never in a process running handlers
        connection.close()  # the next connection gets the limits
        timeouts = watchdog.Watchdog()  # logs timed-out workers, kills one stuck in C code
        timeouts.start()

        stop_requested = threading.Event()
        grace = jobs_settings().SHUTDOWN_GRACE_SECONDS
        family: set[int] = set()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            shutdown.begin(grace)
            if not stop_requested.is_set():
                family.update(descendants(os.getpid()))  # before any of them dies or is orphaned
            stop_requested.set()
            cut_waits_of_this_thread("stop requested")  # e.g. the reaper's query in a partition

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

        def stopped() -> bool:
            return stop_requested.is_set() or not cluster.sentinel.is_alive()

        try:
            if options.get("no_scheduler"):
                while not stopped():
                    stop_requested.wait(0.5)
            else:
                EmbeddedScheduler().run(should_stop=stopped)
        finally:
            ends = shutdown.begin(grace)  # also when the cluster died on its own
            logger.warning(
                "stopping: claiming nothing more; running handlers have %.1f s to finish, then "
                "their jobs are handed back",
                max(0.0, ends - time.monotonic()),
            )
            stop_cluster(cluster, ends, ends + SHUTDOWN_MARGIN_SECONDS, family)
            timeouts.stop()
        # Everything is stopped and every job settled; skip the interpreter's teardown (about
        # half a second of module finalisation on a busy machine) -- logs flushed first.
        registry.before_exit()  # the reaper's last expiries' task_finished notices, say
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)


def stop_cluster(cluster: Cluster, grace_ends: float, deadline: float, family: set[int]) -> None:
    """Stop django-q2 in order; at `deadline` (monotonic) SIGKILL every process left.

    The ordered stop needs a worker to take each task out of django-q2's task queue: under load
    that queue is full (drains requested while every worker was busy), its pusher blocks putting
    one more and its sentinel waits for the pusher, then puts a stop pill per worker. Once the
    grace is over and no worker is left (each handed back its jobs and exited), nothing would
    ever empty it: the helpers left (sentinel, pusher, monitor: transport only, no job of ours)
    get SIGTERM then, instead of a SIGKILL 5 s later.
    """
    try:
        _stop_in_order(cluster, grace_ends, deadline, family)
    finally:
        _reap_adopted((family | descendants(os.getpid())) - {cluster.sentinel.pid}, deadline)


def _stop_in_order(cluster: Cluster, grace_ends: float, deadline: float, family: set[int]) -> None:
    if cluster.sentinel.is_alive():
        stopper = threading.Thread(target=cluster.stop, name="qcluster-stop", daemon=True)
        stopper.start()
        while stopper.is_alive() and time.monotonic() < deadline:
            if time.monotonic() >= grace_ends and not watchdog.live_workers():
                _terminate(_alive_ones(family))
                stopper.join(max(0.0, deadline - time.monotonic()))
                break
            stopper.join(0.05)  # waiting for the ordered stop, bounded by the deadline
        if not stopper.is_alive():
            return
    else:
        # Gone with a signal to the whole group: the workers got it too and finish on their own
        # (jobs.worker.shutdown.worker_sigterm) -- wait for them until the deadline.
        while _alive_ones(family) and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting for processes to exit, bounded by the deadline
    left = _alive_ones(family)
    if left:
        logger.error(
            "cluster processes still running %.1f s after the grace period; killing %s",
            SHUTDOWN_MARGIN_SECONDS,
            sorted(left),
        )
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _terminate(pids: set[int]) -> None:
    if pids:
        logger.info("no worker left to empty django-q2's task queue: ending %s", sorted(pids))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def adopt_orphans() -> None:
    """Become the reaper of our descendants (Linux): a worker whose sentinel dies first is
    re-parented to this process, not to PID 1 (which, in some containers, reaps late)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: PID 1 reaps them


def _reap_adopted(pids: set[int], deadline: float) -> None:
    """Reap the adopted descendants that have exited (a zombie still counts in its group)."""
    while True:
        waiting = False
        for pid in pids:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue  # not ours to reap (its own parent does), or reaped already
            waiting = waiting or done == 0
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(0.02)  # waiting for adopted processes to exit, bounded by the deadline


def _alive_ones(family: set[int]) -> set[int]:
    """The cluster's live processes: our process group if we lead it (orphans included), else
    our descendants and those seen when the stop began."""
    me = os.getpid()
    group = processes_in_group(me) if os.getpgrp() == me else set()
    return {pid for pid in (family | descendants(me) | group) - {me} if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def processes_in_group(pgid: int) -> set[int]:
    """Every process of process group `pgid`, from /proc (Linux)."""
    found = set()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                found.add(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def descendants(root: int) -> set[int]:
    """Every live descendant of `root`, from /proc (Linux); empty where /proc is missing."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
