"""Waking on enqueue: LISTEN for the enqueue trigger's NOTIFY, on a connection of its own.

Owns: the LISTEN connection and `Waker`, used by the scheduler (to request drains) and by an idle
drain (`IdleWait`: to claim the moment work arrives); and registering a waiting process, so that
enqueues notify only while one waits (jobs/core/sql/queues.py, WAITER; migration 0022). Never:
claims or writes anything.

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
from typing import Any

import psycopg
from django.db import DatabaseError, connection

from jobs.core import transitions
from jobs.core.conf import jobs_settings
from jobs.core.connectivity import OutageLog, bounded, direct_session
from jobs.core.sql.queues import ENQUEUED_CHANNEL, FENCE_SQL, UNWAIT_SQL, WAIT_SQL, queue_channel
from jobs.worker import shutdown

logger = logging.getLogger("jobs.scheduler")

NOTIFY_CHANNEL = ENQUEUED_CHANNEL  # every enqueue's; each queue also has its own (queue_channel)


def channels(queues: Sequence[str] | None) -> list[str]:
    """What a process serving `queues` LISTENs on: each queue's own channel, so an enqueue into
    a queue it does not serve never wakes it; every enqueue's channel when it serves all."""
    if not queues:
        return [NOTIFY_CHANNEL]
    return sorted({queue_channel(q) for q in queues})


LIVENESS_SECONDS = 5.0  # an idle LISTEN connection is probed after this long without traffic
# A new waiter whose fence is held by enqueues still in flight tries it again after this, then
# twice as long each time up to 0.25 s (one round trip each); meanwhile every new enqueue
# notifies it.
FENCE_RETRY_SECONDS = 0.01


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

    Enqueues notify only while some process waits (jobs/core/sql/queues.py, WAITER): `wait()`
    registers this one (unless `register=False`) and keeps it registered until `release()` --
    the caller found work and is busy -- or the connection closes. Registering returns True once
    the fence is passed (enqueues that looked before we registered are committed: look again);
    until then the fence is tried every FENCE_RETRY_SECONDS.
    """

    def __init__(
        self, outage: OutageLog | None = None, queues: Sequence[str] | None = None
    ) -> None:
        self.channels = channels(queues)
        self._conn: psycopg.Connection | None = None
        self._fresh = False
        self._heard_at = 0.0  # time.monotonic() of the last traffic on the LISTEN connection
        self._waiting = False  # this connection holds WAITER
        self._fenced = False  # ... and has passed the fence since it took it
        self._direct = False  # the LISTEN session is PostgreSQL's own, not a pooler's
        self.outage = outage or OutageLog("scheduler LISTEN connection", logger)

    def _connect(self) -> psycopg.Connection | None:
        if connection.vendor != "postgresql":
            return None
        if self._conn is None or self._conn.closed:
            self._conn = listen_connection()  # connect_timeout bounds it (settings OPTIONS)
            with bounded("LISTEN", conn=self._conn):
                # Channel names are [a-z0-9_] only (queue_channel): no quoting needed.
                self._conn.execute("; ".join(f"LISTEN {c}" for c in self.channels))
                # Behind a transaction pooler a session lock would stay on whichever server
                # connection took it: register only on a session of our own (there LISTEN
                # hears nothing anyway).
                self._direct = direct_session(self._conn)
            self._heard_at = time.monotonic()
            self._fresh = True
            self._waiting = self._fenced = False
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

    def wait(self, timeout: float, register: bool = True) -> bool:
        """True when woken (a NOTIFY, a fresh LISTEN, a passed fence): look for work now.
        `register=False`: listen without asking enqueues to notify (and stop asking)."""
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
            if not register or not self._direct:
                self.release()
                if self._conn is None:  # the release failed: closed, reported
                    return False
            elif not self._fenced:
                return self._register(conn, timeout)
            return self._select(conn, timeout)
        except (psycopg.Error, OSError) as exc:
            self.outage.failed(exc)
            self.close()
            return False

    def _select(self, conn: psycopg.Connection, timeout: float) -> bool:
        ready, _, _ = select.select([conn.fileno()], [], [], timeout)
        woke = False
        if ready:
            self._heard_at = time.monotonic()
            # Drain every queued notification at once: one wake-up per burst of enqueues.
            for _ in conn.notifies(timeout=0):
                woke = True
        return woke

    def _register(self, conn: psycopg.Connection, timeout: float) -> bool:
        """Hold WAITER and pass the fence: True once passed (look again) or on a NOTIFY heard
        meanwhile; False at `timeout` with the fence still held by enqueues in flight (the
        tries back off from FENCE_RETRY_SECONDS, so a transaction left open after an enqueue
        costs a few round trips a second, not a tick storm)."""
        deadline = time.monotonic() + timeout
        pause = FENCE_RETRY_SECONDS
        while True:
            sql = FENCE_SQL if self._waiting else WAIT_SQL
            with bounded("wake-up registration", conn=conn):
                fenced = bool(conn.execute(sql).fetchone()[-1])  # type: ignore[index]
            self._waiting = True
            self._heard_at = time.monotonic()
            # A NOTIFY read with the answer is in psycopg's backlog, out of select()'s sight.
            heard = sum(1 for _ in conn.notifies(timeout=0))
            self._fenced = fenced
            left = deadline - time.monotonic()
            if fenced or heard or left <= 0:
                return fenced or heard > 0
            if self._select(conn, min(pause, left)):
                return True
            pause = min(pause * 2, 0.25)

    def release(self) -> None:
        """Stop asking enqueues to notify (the caller is busy); listening goes on."""
        if not self._waiting:
            return
        self._waiting = self._fenced = False
        if self._conn is None or self._conn.closed:
            return
        try:
            with bounded("wake-up release", conn=self._conn):
                held = self._conn.execute(UNWAIT_SQL).fetchone()
            self._heard_at = time.monotonic()
            if not (held and held[0]):  # not ours to give back: end the session, which does
                raise psycopg.OperationalError("WAITER was not held by the LISTEN session")
        except (psycopg.Error, OSError) as exc:
            self.outage.failed(exc)
            self.close()  # the session's end gives the lock back

    def close(self) -> None:
        self._waiting = self._fenced = False
        if self._conn is not None:
            try:
                self._conn.close()
            except (psycopg.Error, OSError):
                pass
            self._conn = None


class IdleWait:
    """How a worker's drain with nothing to do hears of new work in milliseconds.

    It LISTENs on the enqueue channel (the NOTIFY the enqueue trigger sends on commit, also for a
    job requeued by a retry, a release or the reaper) and claims again the moment one arrives --
    without a busy poll and without django-q2's broker poll in the way. It also claims again
    every POLL_SECONDS whatever it heard (a retry whose run_at comes due sends no NOTIFY then;
    behind a transaction pooler LISTEN hears nothing), and gives up after IDLE_WAIT_SECONDS, at
    the drain's deadline, or as soon as a shutdown is requested (checked every 0.25 s). Every
    claim is the ordinary fenced claim: waiting changes no fence.

    The LISTEN connection is this drain's own and closed when the drain ends; a fresh LISTEN
    counts as a wake-up (a job committed just before it took effect notified nobody). While it
    waits the drain is registered (Waker), so enqueues notify it; `busy()` ends that.
    """

    def __init__(self, cfg: Any, queues: Sequence[str] | None, outage: OutageLog) -> None:
        self.queues = queues  # LISTENs for these queues' enqueues only
        self.outage = outage
        self.enabled = cfg.IDLE_WAIT_SECONDS > 0 and connection.vendor == "postgresql"
        self.seconds = float(cfg.IDLE_WAIT_SECONDS)
        self.poll = float(cfg.POLL_SECONDS)
        self.waker: Waker | None = None
        self.until: float | None = None  # when this stretch of idleness gives up

    def busy(self, backlog: bool = True) -> None:
        """A claim found work: the next idleness gets a full IDLE_WAIT_SECONDS again. With a
        `backlog` (the claim came back full) enqueues stop notifying this drain until it waits
        again (Waker.release): it will claim their jobs anyway. A claim that emptied the queue
        keeps the registration -- the drain is about to wait again, and a release then a new
        registration (two round trips and a claim) per job would cost a stream that keeps up
        more than the NOTIFYs it saves."""
        self.until = None
        if backlog and self.waker is not None:
            self.waker.release()

    def wait(self, deadline: float) -> bool:
        """True: claim again now. False: the drain should end."""
        if not self.enabled:
            return False
        if self.waker is None:
            self.waker = Waker(self.outage, self.queues)
        now = time.monotonic()
        if self.until is None:
            self.until = now + self.seconds
        until, poll_at = min(deadline, self.until), now + self.poll
        while not shutdown.requested():
            now = time.monotonic()
            if now >= until:
                return False
            if now >= poll_at:
                return True
            self._keep_claim_ready()
            if self.waker.wait(min(0.25, poll_at - now, until - now)):
                return True
        return False

    def _keep_claim_ready(self) -> None:
        """The claim a NOTIFY wakes us for is one round trip: what it must know beforehand
        (whether its queues are limited) is re-read now, while nothing waits on it."""
        try:
            with bounded("claim limits"):
                transitions.refresh_limits(self.queues)
        except DatabaseError:
            pass  # the claim itself reads it again, and reports an outage

    def close(self) -> None:
        if self.waker is not None:
            self.waker.close()
            self.waker = None
