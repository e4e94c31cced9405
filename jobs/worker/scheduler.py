"""The embedded scheduler that `manage.py qcluster` runs beside django-q2's workers.

Owns: waking drains when work is due (LISTEN/NOTIFY on PostgreSQL, a short poll otherwise and as a
safety net for retries whose run_at arrives later), and running the lease reaper. The outbox relay
and the orphan janitor run on a thread of their own (jobs/worker/maintenance.py).

Never: claims or runs jobs itself. Every write it causes is a compare-and-set, so two schedulers
(two qcluster processes) at once are harmless: a surplus drain claims nothing, a reclaim that lost
its race changes zero rows.

Hazards: the LISTEN wake-up lives in jobs/worker/listener.py (its own connection, probed when
quiet); time comparisons happen in SQL with the database clock. Every tick is bounded
(jobs/core/connectivity.py) and an outage is logged once, then as a rate-limited reminder,
then as the recovery -- never a traceback per tick. Nothing a tick raises ends the loop (and with
it qcluster): anything but a database error is a fault, logged with its traceback at most every
OUTAGE_LOG_SECONDS, and the next tick tries again. The cron sync runs in the first tick, and
again every SYNC_RETRY_SECONDS until one succeeded.
"""

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, connection
from django.db.backends.signals import connection_created

from jobs.core import transitions
from jobs.core.conf import jobs_settings
from jobs.core.connectivity import OutageLog, bounded
from jobs.ops import cron as schedules
from jobs.worker import bridge, reaper, unresolved
from jobs.worker.listener import Waker
from jobs.worker.maintenance import Maintenance

logger = logging.getLogger("jobs.scheduler")

SCHEDULE_CHECK_SECONDS = 0.5  # how often due cron ticks are looked for
# The least time between two ticks woken by enqueues. Under a stream every enqueue notifies, and
# a tick per notification would spend the database's time counting due work hundreds of times a
# second; the drains' own LISTEN (jobs.worker.runner) is what starts a job in milliseconds, a
# tick only sends drains where none stand.
TICK_SPACING_SECONDS = 0.05
SYNC_RETRY_SECONDS = 10.0  # a failed sync of the cron declarations is tried again this late


def limit_statements_of_this_process() -> None:
    """Server-side timeouts on every connection this process opens from now on.

    Only for a process that runs nothing but the platform's own short statements -- qcluster's
    main process, once django-q2's processes are forked (they run handlers, which may run long
    queries). The server then cancels a statement stuck behind a lock or a slow plan itself:
    a known outcome (rolled back), and no backend left running after the client-side deadline
    (jobs.core.connectivity) has cut the socket. Nothing here ends an attempt, so no cancelled
    statement can make a decided write look undecided.
    """
    pid = os.getpid()
    timeout_ms = int(jobs_settings().DB_TIMEOUT_SECONDS * 1000)

    def limit(sender: object, connection: Any, **kwargs: object) -> None:
        if os.getpid() != pid or connection.vendor != "postgresql":
            return
        limit_session(connection, timeout_ms)

    connection_created.connect(limit, weak=False, dispatch_uid="jobs.scheduler.limit")


def limit_session(connection: Any, timeout_ms: int) -> bool:
    """Set this session's statement and lock timeouts, unless a pooler is in the way; True if
    set. Behind a transaction pooler (PgBouncer, pgcat, Odyssey: the backend pid the start-up
    gave is not the server's) the settings would stay on a pooled server connection and reach
    other clients' transactions -- a handler's long report, a web request. The statement
    decides in one round trip: its WHERE gates the set_config calls."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT set_config('statement_timeout', %s, false), "
            "set_config('lock_timeout', %s, false) WHERE pg_backend_pid() = %s",
            [
                f"{timeout_ms}ms",
                f"{max(1, timeout_ms // 2)}ms",
                connection.connection.info.backend_pid,
            ],
        )
        return cur.fetchone() is not None


class EmbeddedScheduler:
    def __init__(self, queues: Sequence[str] | None = None) -> None:
        cfg = jobs_settings()
        self.identity = f"{socket.gethostname()}:{os.getpid()}:scheduler"
        self.queues = queues or cfg.QUEUES
        self.waker = Waker(queues=self.queues)
        self.broker = bridge.new_broker()
        self._next_reap = 0.0
        self._next_cron = 0.0
        self._next_standing = 0.0
        self._next_sync = 0.0
        self._synced = False  # the cron declarations are in jobs_schedule
        self._idle = True  # nothing was due at the last tick: enqueues are asked to notify us
        self.outage = OutageLog("scheduler", logger)
        self.faults = Faults()

    def tick(self) -> None:
        cfg = jobs_settings()
        now = time.monotonic()
        with bounded("scheduler tick"):
            if now >= self._next_reap:
                reaper.reap(self.identity, tell=reaper.tell_later)
                self._next_reap = now + cfg.REAPER_SECONDS
            self.dispatch()
            unresolved.resolve_pending()
        if now >= self._next_cron:  # cron ticks (jobs.ops.cron): exactly once per tick
            self._next_cron = now + SCHEDULE_CHECK_SECONDS  # after a failed pass too
            self.cron_pass(now)

    def cron_pass(self, now: float) -> None:
        """Sync the cron declarations until that succeeded once, then enqueue what is due. A
        failed sync is retried SYNC_RETRY_SECONDS later; the passes between run on the rows."""
        if not self._synced and now >= self._next_sync:
            self._next_sync = now + SYNC_RETRY_SECONDS
            schedules.sync()
            self._synced = True
        schedules.run_due()  # a deadline per schedule, and a time budget for the pass

    def dispatch(self) -> None:
        """Make sure enough drains are on their way for the work that is due now -- and, while
        idle, that drains stand waiting for the next job (listener.IdleWait)."""
        workers = bridge.worker_count()
        due = transitions.count_due(workers, self.queues)
        self._idle = not due
        if not due:
            self._keep_drains_standing(workers)
            return
        missing = min(due, workers) - bridge.pending_drains(self.broker)
        if missing > 0:
            bridge.request_drains(missing, self.queues, self.broker)

    def _keep_drains_standing(self, workers: int) -> None:
        """A drain idle-waits at most IDLE_WAIT_SECONDS (and its budget); so that a job committed
        into an idle cluster is still claimed in milliseconds later on, a fresh set of drains is
        requested a little before the standing ones give up. They queue in django-q2 behind
        the waiting ones (never more than `workers` in the broker) and take over as those end."""
        cfg = jobs_settings()
        if cfg.IDLE_WAIT_SECONDS <= 0 or connection.vendor != "postgresql":
            return
        now = time.monotonic()
        if now < self._next_standing:
            return
        missing = workers - bridge.pending_drains(self.broker)
        if missing > 0:
            bridge.request_drains(missing, self.queues, self.broker)
        self._next_standing = now + 0.9 * min(cfg.IDLE_WAIT_SECONDS, cfg.DRAIN_SECONDS)

    def run(self, should_stop: Callable[[], bool]) -> None:
        logger.info("embedded scheduler %s started", self.identity)
        cfg = jobs_settings()
        maintenance = Maintenance(self.identity)
        maintenance.start()
        try:
            while not should_stop():
                ticked = time.monotonic()
                try:
                    self.tick()
                    self.outage.recovered()
                except DatabaseError as exc:
                    connection.close()
                    if should_stop():
                        break  # a stop cut the tick's wait: no outage to report
                    self.outage.failed(exc)
                except Exception as exc:  # noqa: BLE001  a fault must not end qcluster
                    self.faults.failed(exc)
                timeout = min(cfg.POLL_SECONDS, cfg.REAPER_SECONDS)
                # While work is due the drains are on it: enqueues need not notify this tick
                # (each NOTIFY serializes enqueue commits), which then comes at the poll.
                # Without standing drains (IDLE_WAIT_SECONDS 0) it is the only waiter: always.
                register = self._idle or cfg.IDLE_WAIT_SECONDS <= 0
                if self.waker.wait(timeout, register=register):
                    # heard enqueues: the next tick waits out the spacing (its notifications
                    # pile up meanwhile and wake one tick)
                    pause = ticked + TICK_SPACING_SECONDS - time.monotonic()
                    if pause > 0:
                        time.sleep(pause)
        finally:
            maintenance.stop()
            self.waker.close()
            connection.close()
            logger.info("embedded scheduler %s stopped", self.identity)


class Faults:
    """A tick that raised something other than a database error -- a bug, a schedule croniter
    cannot evaluate: logged with its traceback at most once per OUTAGE_LOG_SECONDS, with the
    count of failures since the last report (a tick comes every fraction of a second)."""

    def __init__(self) -> None:
        self.unreported = 0
        self._logged_at = -float("inf")

    def failed(self, exc: BaseException) -> None:
        self.unreported += 1
        now = time.monotonic()
        if now - self._logged_at < jobs_settings().OUTAGE_LOG_SECONDS:
            return
        self._logged_at = now
        logger.error(
            "scheduler tick failed (%s time(s) since the last report); the next tick tries again",
            self.unreported,
            exc_info=exc,
        )
        self.unreported = 0
