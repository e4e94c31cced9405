"""The embedded scheduler that `manage.py qcluster` runs beside django-q2's workers.

Owns: waking drains when work is due (LISTEN/NOTIFY on PostgreSQL, a short poll otherwise and as a
safety net for retries whose run_at arrives later), and running the lease reaper. The outbox relay
and the orphan janitor run on a thread of their own (jobs/maintenance.py).

Never: claims or runs jobs itself. Every write it causes is a compare-and-set, so two schedulers
(two qcluster processes) at once are harmless: a surplus drain claims nothing, a reclaim that lost
its race changes zero rows.

Hazards: the LISTEN connection is its own psycopg connection (never Django's pooled one) and is
re-opened after any error; time comparisons happen in SQL with the database clock. An idle LISTEN
socket cannot tell a quiet database from a dead one (a half-open connection: the server gone, the
socket still open), so after LIVENESS_SECONDS without traffic a bounded `SELECT 1` probes it.
Every tick is bounded (jobs.connectivity) and an outage is logged once, then as a rate-limited
reminder, then as the recovery -- never a traceback per tick.
"""

import logging
import os
import select
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from django.db import DatabaseError, connection
from django.db.backends.signals import connection_created

from jobs import bridge, reaper, schedules, transitions, unresolved
from jobs.conf import jobs_settings
from jobs.connectivity import OutageLog, bounded
from jobs.maintenance import Maintenance

logger = logging.getLogger("jobs.scheduler")

NOTIFY_CHANNEL = "jobs_enqueued"
SCHEDULE_CHECK_SECONDS = 0.5  # how often due cron ticks are looked for
LIVENESS_SECONDS = 5.0  # an idle LISTEN connection is probed after this long without traffic


def limit_statements_of_this_process() -> None:
    """Server-side timeouts on every connection this process opens from now on.

    Only for a process that runs nothing but the platform's own short statements -- qcluster's
    main process, once django-q2's processes are forked (they run handlers, which may run long
    queries). The server then cancels a statement stuck behind a lock or a slow plan itself:
    a known outcome (rolled back), and no backend left running after the client-side deadline
    (jobs.connectivity) has cut the socket. Nothing here ends an attempt, so no cancelled
    statement can make a decided write look undecided.
    """
    pid = os.getpid()
    timeout_ms = int(jobs_settings().DB_TIMEOUT_SECONDS * 1000)

    def limit(sender: object, connection: Any, **kwargs: object) -> None:
        if os.getpid() != pid or connection.vendor != "postgresql":
            return
        with connection.cursor() as cur:
            cur.execute(
                "SELECT set_config('statement_timeout', %s, false), "
                "set_config('lock_timeout', %s, false)",
                [f"{timeout_ms}ms", f"{max(1, timeout_ms // 2)}ms"],
            )

    connection_created.connect(limit, weak=False, dispatch_uid="jobs.scheduler.limit")


def dedicated_connection(autocommit: bool = True) -> psycopg.Connection:
    """A psycopg connection of its own to Django's database, outside Django's pooling."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)  # Django's adapters stay with Django's connections
    params.pop("context", None)
    # No server-side prepared statements: behind a transaction pooler (PgBouncer) the next
    # statement may run on another server connection, where the prepared one does not exist.
    params["prepare_threshold"] = None
    return psycopg.connect(**params, autocommit=autocommit)


# libpq options of Django's connection that bound waits; they apply to a LISTEN_URL connection too
_NETWORK_OPTIONS = frozenset(
    {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
     "keepalives_count", "tcp_user_timeout"}
)  # fmt: skip


def listen_connection() -> psycopg.Connection:
    """The LISTEN connection: JOBS["LISTEN_URL"] when set (a direct session connection beside a
    transaction pooler, where LISTEN does not work), else one like Django's own."""
    url = jobs_settings().LISTEN_URL
    if not url:
        return dedicated_connection()
    params = connection.get_connection_params()
    keep = {k: v for k, v in params.items() if k in _NETWORK_OPTIONS}
    return psycopg.connect(url, **keep, autocommit=True, prepare_threshold=None)


class Waker:
    """Blocks until a NOTIFY on NOTIFY_CHANNEL or `timeout`; falls back to sleeping.

    A (re)connected LISTEN returns at once as if notified: whatever was committed before the
    LISTEN took effect sent its NOTIFY to nobody, so the caller looks for work now.
    """

    def __init__(self, outage: OutageLog | None = None) -> None:
        self._conn: psycopg.Connection | None = None
        self._fresh = False
        self._heard_at = 0.0  # time.monotonic() of the last traffic on the LISTEN connection
        self.outage = outage or OutageLog("scheduler LISTEN connection", logger)

    def _connect(self) -> psycopg.Connection | None:
        if connection.vendor != "postgresql":
            return None
        if self._conn is None or self._conn.closed:
            self._conn = listen_connection()  # connect_timeout bounds it (settings OPTIONS)
            with bounded("LISTEN", conn=self._conn):
                self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self._heard_at = time.monotonic()
            self._fresh = True
        elif time.monotonic() - self._heard_at > LIVENESS_SECONDS:
            # Quiet for a while: make sure the server is still there to notify us.
            with bounded("LISTEN liveness probe", conn=self._conn):
                self._conn.execute("SELECT 1")
            self._heard_at = time.monotonic()
        return self._conn

    def wait(self, timeout: float) -> bool:
        try:
            conn = self._connect()
            self.outage.recovered()
        except (psycopg.Error, OSError) as exc:
            self.outage.failed(exc)
            self.close()
            conn = None
        if conn is None:
            time.sleep(timeout)  # no notification channel: this is the poll interval
            return False
        if self._fresh:
            self._fresh = False
            return True
        try:
            ready, _, _ = select.select([conn.fileno()], [], [], timeout)
            woke = False
            if ready:
                self._heard_at = time.monotonic()
                # Drain every queued notification at once: one wake-up per burst of enqueues.
                for _ in conn.notifies(timeout=0):
                    woke = True
            return woke
        except (psycopg.Error, OSError) as exc:
            self.outage.failed(exc)
            self.close()
            return False

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except (psycopg.Error, OSError):
                pass
            self._conn = None


class EmbeddedScheduler:
    def __init__(self, queues: Sequence[str] | None = None) -> None:
        cfg = jobs_settings()
        self.identity = f"{socket.gethostname()}:{os.getpid()}:scheduler"
        self.queues = queues or cfg.QUEUES
        self.waker = Waker()
        self.broker = bridge.new_broker()
        self._next_reap = 0.0
        self._next_cron = 0.0
        self._next_standing = 0.0
        self.outage = OutageLog("scheduler", logger)

    def tick(self) -> None:
        cfg = jobs_settings()
        now = time.monotonic()
        with bounded("scheduler tick"):
            if now >= self._next_reap:
                reaper.reap(self.identity)
                self._next_reap = now + cfg.REAPER_SECONDS
            self.dispatch()
            unresolved.resolve_pending()
        if now >= self._next_cron:  # cron ticks (jobs.schedules): exactly once per tick
            with bounded("cron tick"):
                schedules.run_due()
            self._next_cron = now + SCHEDULE_CHECK_SECONDS

    def dispatch(self) -> None:
        """Make sure enough drains are on their way for the work that is due now -- and, while
        idle, that drains stand waiting for the next job (runner._IdleWait)."""
        workers = bridge.worker_count()
        due = transitions.count_due(workers, self.queues)
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
            try:
                schedules.sync()
            except DatabaseError:
                logger.exception("cron schedules could not be synced; retried at next start")
                connection.close()
            while not should_stop():
                try:
                    self.tick()
                    self.outage.recovered()
                except DatabaseError as exc:
                    self.outage.failed(exc)
                    connection.close()
                timeout = min(cfg.POLL_SECONDS, cfg.REAPER_SECONDS)
                self.waker.wait(timeout)
        finally:
            maintenance.stop()
            self.waker.close()
            connection.close()
            logger.info("embedded scheduler %s stopped", self.identity)
