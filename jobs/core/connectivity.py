"""Bounded database waits and outage logging for the platform's own round trips.

Owns: `bounded()` -- a client-side deadline on one round trip of the platform (claim, heartbeat,
commit, reaper, dispatch, the broker's poll, the LISTEN liveness probe). A watchdog thread shuts
the connection's socket down when the deadline passes, so the blocked call fails at once with a
connection error and the caller's ordinary "connection lost" path runs: a final write's outcome
is then re-read on a fresh connection (jobs.worker.completer), never guessed. `OutageLog` logs an
outage once, then a reminder at most every OUTAGE_LOG_SECONDS, then the recovery.

Why client-side: during a partition the server never sees the statement, so `statement_timeout`
cannot fire; TCP keepalives and `tcp_user_timeout` (config/settings.py) catch a peer that stops
acknowledging, but not one that acknowledges and never answers (a stalled proxy or server).

Never: arms a deadline around a handler's own queries (they may legitimately run long), and never
cuts a socket that is no longer the armed one (the socket's inode is checked first).

Hazards: the watchdog thread belongs to the process that started it; after a fork the child
starts its own on first use.
"""

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

from jobs.core.conf import jobs_settings

logger = logging.getLogger("jobs.connectivity")


@dataclass
class _Armed:
    deadline: float
    fd: int
    inode: int
    thread: int
    what: str
    cut: bool = False


class _Watchdog:
    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._armed: dict[int, _Armed] = {}
        self._next_token = 0
        self._thread: threading.Thread | None = None
        self._wakes_at = float("inf")  # when the watchdog thread will look next

    def arm(self, fd: int, seconds: float, what: str) -> int:
        inode = os.fstat(fd).st_ino
        with self._lock:
            self._next_token += 1
            token = self._next_token
            deadline = time.monotonic() + seconds
            self._armed[token] = _Armed(deadline, fd, inode, threading.get_ident(), what)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="jobs-db-watchdog")
                self._thread.daemon = True
                self._thread.start()
            if deadline < self._wakes_at:
                # Only then: deadlines share one length, so a new one is almost always later
                # than the one the thread waits for, and the hot path pays no thread switch.
                self._wake.notify()
        return token

    def disarm(self, token: int) -> bool:
        """Forget the deadline; True if it had fired (the socket was cut)."""
        with self._lock:
            armed = self._armed.pop(token, None)
        return bool(armed and armed.cut)

    def cut_thread(self, thread: int, why: str) -> None:
        """Cut every armed wait of `thread` now (a stop signal must not wait for the network)."""
        with self._lock:
            for armed in self._armed.values():
                if armed.thread == thread and not armed.cut:
                    self._cut(armed, why)

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                pending = [a for a in self._armed.values() if not a.cut]
                for armed in pending:
                    if armed.deadline <= now:
                        self._cut(armed, "no answer within its deadline")
                later = [a.deadline for a in pending if a.deadline > now]
                self._wakes_at = min(later) if later else now + 60.0
                self._wake.wait(self._wakes_at - now)

    @staticmethod
    def _cut(armed: _Armed, why: str) -> None:
        # Called with the lock held: the owner cannot disarm (and so close the socket) meanwhile,
        # and the inode check refuses a descriptor number reused by another socket.
        armed.cut = True
        try:
            if os.fstat(armed.fd).st_ino != armed.inode:
                return
            sock = socket.socket(fileno=os.dup(armed.fd))
        except OSError:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()
        logger.debug("database round trip cut (%s): %s", why, armed.what)


_watchdog = _Watchdog()


def direct_session(raw: Any) -> bool:
    """Whether psycopg connection `raw` reaches PostgreSQL itself rather than a pooler: the
    backend pid the server reports equals the one the start-up message gave (PgBouncer, pgcat
    and Odyssey answer the start-up themselves and make that pid up). One round trip."""
    row = raw.execute("SELECT pg_backend_pid()").fetchone()
    return row is not None and bool(row[0] == raw.info.backend_pid)


def _socket_of(conn: Any) -> int | None:
    """The socket of a psycopg connection, or of Django's (connecting it first); None on SQLite."""
    if hasattr(conn, "vendor"):  # a Django connection wrapper
        if conn.vendor != "postgresql":
            return None
        conn.ensure_connection()  # bounded by libpq's connect_timeout
        conn = conn.connection
    try:
        return int(conn.fileno())
    except Exception:  # noqa: BLE001  a closed or broken connection: nothing to arm
        return None


@contextmanager
def bounded(what: str, seconds: float | None = None, conn: Any = None) -> Iterator[None]:
    """Give the enclosed round trip(s) on `conn` (default: Django's) a deadline of `seconds`."""
    if seconds is None:
        seconds = jobs_settings().DB_TIMEOUT_SECONDS
    # Django's connection of this thread, looked up once (not through its per-thread proxy).
    fd = _socket_of(connections[DEFAULT_DB_ALIAS] if conn is None else conn)
    if fd is None:
        yield
        return
    token = _watchdog.arm(fd, seconds, what)
    try:
        yield
    except Exception as exc:
        if not _watchdog.disarm(token):
            raise
        # Same type (callers catch their driver's or Django's connection errors), plainer words.
        try:
            plain = type(exc)(f"no answer within {seconds:g} s ({what}); connection cut")
        except Exception:  # noqa: BLE001  an exception type that takes other arguments
            raise exc from None
        raise plain from exc
    finally:
        _watchdog.disarm(token)


def cut_waits_of_this_thread(why: str) -> None:
    """Fail this thread's bounded round trips now (from a signal handler: stop means stop).

    The cut runs on a thread of its own: the signal may have interrupted this very thread
    while it held the watchdog's lock (arming or disarming), which it would wait for forever.
    """
    thread = threading.get_ident()
    threading.Thread(
        target=_watchdog.cut_thread, args=(thread, why), name="jobs-db-cut", daemon=True
    ).start()


class OutageLog:
    """One line when the database goes away, a reminder while it stays away, one when it is back.

    Replaces a traceback per failed attempt (which, retried every 0.2 s, buried everything else).
    """

    def __init__(self, what: str, log: logging.Logger = logger) -> None:
        self.what = what
        self.log = log
        self.failures = 0
        self._since = 0.0
        self._logged_at = 0.0

    @property
    def down(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        self.failures += 1
        summary = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        if self.failures == 1:
            self._since = self._logged_at = now
            # A connection error says all in one line; anything else may be a bug: traceback.
            trace = (
                None
                if isinstance(
                    exc, OperationalError | InterfaceError | psycopg.OperationalError | OSError
                )
                else exc
            )
            self.log.error(
                "%s: database unreachable (%s); retrying", self.what, summary, exc_info=trace
            )
        elif now - self._logged_at >= jobs_settings().OUTAGE_LOG_SECONDS:
            self._logged_at = now
            self.log.error(
                "%s: database still unreachable after %.0f s (%s failures; last: %s)",
                self.what,
                now - self._since,
                self.failures,
                summary,
            )

    def recovered(self) -> None:
        if self.failures:
            self.log.warning(
                "%s: database reachable again after %.1f s (%s failures)",
                self.what,
                time.monotonic() - self._since,
                self.failures,
            )
        self.failures = 0

    def backoff(self, first: float = 0.05, cap: float = 0.25) -> float:
        """Pause before the next try: short, so service resumes well under a second after."""
        return float(min(cap, first * 2 ** min(max(self.failures - 1, 0), 10)))
