"""Waking on enqueue: LISTEN for the enqueue trigger's NOTIFY, on a connection of its own.

Owns: the LISTEN connection and `Waker`, used by the scheduler (to request drains) and by an idle
drain (to claim the moment work arrives). Never: claims or writes anything.

Hazards: the LISTEN connection is its own psycopg connection (never Django's pooled one) and is
re-opened after any error. An idle LISTEN socket cannot tell a quiet database from a dead one (a
half-open connection: the server gone, the socket still open), so after LIVENESS_SECONDS without
traffic a bounded `SELECT 1` probes it; a NOTIFY read with the probe's answer lands in psycopg's
backlog, not on the socket, so the probe drains that backlog and counts it as a wake-up. Behind
a transaction pooler LISTEN hears nothing: JOBS["LISTEN_URL"] gives the listeners a direct
session, and the drains' periodic claim covers the rest.
"""

import logging
import select
import time
from collections.abc import Sequence

import psycopg
from django.db import connection

from jobs.core.conf import jobs_settings
from jobs.core.connectivity import OutageLog, bounded
from jobs.core.sql.queues import ENQUEUED_CHANNEL, queue_channel

logger = logging.getLogger("jobs.scheduler")

NOTIFY_CHANNEL = ENQUEUED_CHANNEL  # every enqueue's; each queue also has its own (queue_channel)


def channels(queues: Sequence[str] | None) -> list[str]:
    """What a process serving `queues` LISTENs on: each queue's own channel, so an enqueue into
    a queue it does not serve never wakes it; every enqueue's channel when it serves all."""
    if not queues:
        return [NOTIFY_CHANNEL]
    return sorted({queue_channel(q) for q in queues})


LIVENESS_SECONDS = 5.0  # an idle LISTEN connection is probed after this long without traffic


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
    """Blocks until a NOTIFY on the channels of its queues or `timeout`; falls back to sleeping.

    A (re)connected LISTEN returns at once as if notified: whatever was committed before the
    LISTEN took effect sent its NOTIFY to nobody, so the caller looks for work now.
    """

    def __init__(
        self, outage: OutageLog | None = None, queues: Sequence[str] | None = None
    ) -> None:
        self.channels = channels(queues)
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
                # Channel names are [a-z0-9_] only (queue_channel): no quoting needed.
                self._conn.execute("; ".join(f"LISTEN {c}" for c in self.channels))
            self._heard_at = time.monotonic()
            self._fresh = True
        elif time.monotonic() - self._heard_at > LIVENESS_SECONDS:
            # Quiet for a while: make sure the server is still there to notify us.
            with bounded("LISTEN liveness probe", conn=self._conn):
                self._conn.execute("SELECT 1")
            self._heard_at = time.monotonic()
            # A NOTIFY that arrived with the probe's answer was read off the socket into
            # psycopg's backlog, where select() in `wait` cannot see it: drain it here and
            # wake as if notified, or the wake-up is lost until the next poll.
            if sum(1 for _ in self._conn.notifies(timeout=0)):
                self._fresh = True
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
