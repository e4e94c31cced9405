"""The embedded scheduler that `manage.py qcluster` runs beside django-q2's workers.

Owns: waking drains when work is due (LISTEN/NOTIFY on PostgreSQL, a short poll otherwise and as a
safety net for retries whose run_at arrives later), and running the lease reaper. The outbox relay
and the orphan janitor run on a thread of their own (jobs/maintenance.py).

Never: claims or runs jobs itself. Every write it causes is a compare-and-set, so two schedulers
(two qcluster processes) at once are harmless: a surplus drain claims nothing, a reclaim that lost
its race changes zero rows.

Hazards: the LISTEN connection is its own psycopg connection (never Django's pooled one) and is
re-opened after any error; time comparisons happen in SQL with the database clock.
"""

import logging
import os
import select
import socket
import time
from collections.abc import Callable, Sequence

import psycopg
from django.db import DatabaseError, connection

from jobs import bridge, reaper, schedules, transitions
from jobs.conf import jobs_settings
from jobs.maintenance import Maintenance

logger = logging.getLogger("jobs.scheduler")

NOTIFY_CHANNEL = "jobs_enqueued"
SCHEDULE_CHECK_SECONDS = 0.5  # how often due cron ticks are looked for


def dedicated_connection(autocommit: bool = True) -> psycopg.Connection:
    """A psycopg connection of its own to Django's database, outside Django's pooling."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)  # Django's adapters stay with Django's connections
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=autocommit)


class Waker:
    """Blocks until a NOTIFY on NOTIFY_CHANNEL or `timeout`; falls back to sleeping."""

    def __init__(self) -> None:
        self._conn: psycopg.Connection | None = None

    def _connect(self) -> psycopg.Connection | None:
        if connection.vendor != "postgresql":
            return None
        if self._conn is None or self._conn.closed:
            self._conn = dedicated_connection()
            self._conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        return self._conn

    def wait(self, timeout: float) -> bool:
        try:
            conn = self._connect()
        except psycopg.Error:
            logger.warning("LISTEN connection failed; polling", exc_info=True)
            conn = None
        if conn is None:
            time.sleep(timeout)  # no notification channel: this is the poll interval
            return False
        try:
            ready, _, _ = select.select([conn.fileno()], [], [], timeout)
            woke = False
            if ready:
                # Drain every queued notification at once: one wake-up per burst of enqueues.
                for _ in conn.notifies(timeout=0):
                    woke = True
            return woke
        except (psycopg.Error, OSError):
            logger.warning("LISTEN connection lost; reconnecting", exc_info=True)
            self.close()
            return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
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

    def tick(self) -> None:
        cfg = jobs_settings()
        now = time.monotonic()
        if now >= self._next_reap:
            reaper.reap(self.identity)
            self._next_reap = now + cfg.REAPER_SECONDS
        if now >= self._next_cron:  # cron ticks (jobs.schedules): exactly once per tick
            schedules.run_due()
            self._next_cron = now + SCHEDULE_CHECK_SECONDS
        self.dispatch()

    def dispatch(self) -> None:
        """Make sure enough drains are on their way for the work that is due now."""
        workers = bridge.worker_count()
        due = transitions.count_due(workers, self.queues)
        if not due:
            return
        missing = min(due, workers) - bridge.pending_drains(self.broker)
        if missing > 0:
            bridge.request_drains(missing, self.queues, self.broker)

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
                except DatabaseError:
                    logger.exception("scheduler tick failed; retrying")
                    connection.close()
                timeout = min(cfg.POLL_SECONDS, cfg.REAPER_SECONDS)
                self.waker.wait(timeout)
        finally:
            maintenance.stop()
            self.waker.close()
            connection.close()
            logger.info("embedded scheduler %s stopped", self.identity)
