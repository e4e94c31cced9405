"""What a handler leaves on the worker's database connection, and putting it right.

Owns: looking, after each handler, at the state of the connection the handler shared with the
drain (Django's connection of the drain's thread), and resetting it when the handler left it
unfit for the next job. A handler that returned inside a `transaction.atomic()` it entered by
hand, after a raw `BEGIN`, with autocommit turned off, or in a failed transaction left an open
transaction behind: the drain's claims and the batch's writes would run inside it -- rows
locked and never committed, or a `RuntimeError` for every later drain of this worker process
(the next durable block), forever. A `SET` of a session parameter the server reports and the
drain depends on (`default_transaction_read_only`, `TimeZone`, `DateStyle`, `SESSION
AUTHORIZATION`) would likewise change every later statement of this worker, and an alarm
(SIGALRM) it left pending would go off in a later job: it is cancelled.

What it does then: the connection is closed (the server rolls the open transaction back) and
Django's transaction state reset, so the next statement opens a clean session. A transaction
left open fails the job with its own error (its writes there were rolled back: the work is not
done); a session parameter left changed only costs the connection (a warning): the handler's
work, committed in autocommit, stands. Where DATABASES has more than one alias, a transaction
left open on another alias the thread opened is reset the same way and fails the job too.

A process the handler forked that comes back into the drain (it returned, or raised, where it
should have called `os._exit`) shares the worker's sockets and jobs: it exits at once
(`leave_forked_child`), before it could touch either.

Session state the server does not report -- `SET statement_timeout`, `SET search_path` (before
PostgreSQL 18), `SET ROLE`, a session-level advisory lock, a temporary table, `LISTEN`,
`set_config(..., false)`, `RESET`/`DISCARD` -- is seen from the handler's own statements: while a
handler runs, an execute wrapper on the drain's connection (Django's `execute_wrapper`, so the ORM
and `connection.cursor()`; a statement given as text, bytes or psycopg's `sql.Composed`) marks the
connection when a statement's text does one of those (jobs.worker.session_sql: a `;` inside a
literal, a quoted identifier or a comment splits nothing); it is closed after the handler like one
whose reported parameters changed (the server drops the locks and temporary tables, and the next
job gets a fresh session). Behind a pooler (PgBouncer in transaction pooling:
connectivity.direct_session, asked once per connection on its first such statement) closing ours
would not reach the pooled server connection that ran it: the statement is refused before it is
sent (SessionStateThroughPooler, the handler's own failure). Not seen: such a statement sent
through the driver's own cursor (`connection.connection.cursor()`) or made inside a server-side
function. Django's per-thread activations (`timezone.activate`, `translation.activate`) live in
context variables: the runner runs each handler in a copy of its context (jobs.worker.runner), so
they end with the handler.

Never: a round trip. The looks are local (Django's flags, libpq's transaction status and the
parameters the server reports on every change), so the drain's hot path pays microseconds.
A connection the handler closed and reopened is held to the parameters of the one it replaced.
"""

import logging
import os
import signal
import sys
import threading
import weakref
from typing import Any, NoReturn

from django.db import DEFAULT_DB_ALIAS, connections

from jobs.core.connectivity import direct_session
from jobs.worker.session_sql import touches_session

logger = logging.getLogger("jobs.runner")

# Session parameters PostgreSQL reports to the client whenever they change (ParameterStatus)
# and that would change what the drain's own statements do or read.
_READ_ONLY, _TIME_ZONE, _AUTHORIZATION, _DATE_STYLE = (
    b"default_transaction_read_only",
    b"TimeZone",
    b"session_authorization",
    b"DateStyle",
)
_IDLE, _INERROR, _UNKNOWN = 0, 3, 4  # libpq's PQTRANS_IDLE, PQTRANS_INERROR, PQTRANS_UNKNOWN


class SessionStateThroughPooler(Exception):
    """A handler's statement would leave state on a pooled server connection (refused)."""


# psycopg connection -> whether it reaches PostgreSQL itself (asked once, on its first
# session-touching statement: never on the hot path).
_DIRECT: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _direct(conn: Any) -> bool:
    raw = conn.connection
    if raw is None or getattr(raw, "pgconn", None) is None:
        return True  # not psycopg (SQLite): no pooler
    direct = _DIRECT.get(raw)
    if direct is None:
        try:
            direct = _DIRECT[raw] = direct_session(raw)
        except Exception:  # noqa: BLE001  a failed transaction, a lost connection: the handler's
            return True  # statement then fails on its own, with Django's error, sending nothing
    return direct


def _watch(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
    """The execute wrapper on the drain's connection while a handler runs: marks the connection
    (Django's, of this thread) when a statement touches the session -- or, behind a pooler,
    refuses it before it is sent: closing our client connection would not undo it on the
    pooled server connection, which goes on to serve other jobs' claims and commits."""
    text = sql if isinstance(sql, str) else _text_of(sql, context)
    if text is not None and touches_session(text):
        conn = context["connection"]
        if not _direct(conn):
            raise SessionStateThroughPooler(
                "this statement would leave state on the database session (a session SET or "
                "RESET, set_config(..., false), a session advisory lock, LISTEN, a temporary "
                "table), and the worker reaches PostgreSQL through a pooler (PgBouncer in "
                "transaction pooling): the pooled server connection would keep it for other "
                "jobs. Refused, never sent. Use SET LOCAL or set_config(..., true) inside "
                "transaction.atomic(), or pg_advisory_xact_lock: " + text[:200]
            )
        conn.jobs_hygiene.touched = True
    return execute(sql, params, many, context)


def _text_of(sql: Any, context: Any) -> str | None:
    """The text of a statement not given as a str: psycopg's `sql.SQL(...).format(...)` (a
    `SET {}` built so went unseen) or bytes; None if it cannot be read (the driver says why)."""
    try:
        if isinstance(sql, bytes | bytearray | memoryview):
            return bytes(sql).decode("utf-8", "replace")
        as_string = getattr(sql, "as_string", None)
        return None if as_string is None else str(as_string(context["connection"].connection))
    except Exception:  # noqa: BLE001  not ours to fail: the statement goes to the driver as is
        return None


# enqueue's one-statement path (jobs.models.one_statement) need not go through Django's cursor
# for this wrapper: its statement is ours and touches no session state.
_watch.transparent = True  # type: ignore[attr-defined]


def _params(raw: Any) -> tuple[bytes | None, ...]:
    pgconn = getattr(raw, "pgconn", None)  # libpq itself: no object made per look
    if pgconn is None:
        return ()  # not psycopg (SQLite)
    status = pgconn.parameter_status
    return status(_READ_ONLY), status(_TIME_ZONE), status(_AUTHORIZATION), status(_DATE_STYLE)


class _Kept:
    """What hygiene keeps on Django's connection of a thread (`conn.jobs_hygiene`) between its
    jobs: the driver's connection last seen before a handler and its reported parameters then
    (read once per connection: the drain's lives for many jobs, compared after each handler),
    libpq's look-up of them, the alarm the last handler left, and the execute wrapper's mark."""

    __slots__ = ("conn", "raw", "pgconn", "params", "status", "alarm", "touched", "settings")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.raw: Any = None
        self.pgconn: Any = None  # libpq's connection of `raw` (None: not psycopg)
        self.params: tuple[bytes | None, ...] = ()
        self.status: Any = None  # pgconn.parameter_status of `raw` (None: not psycopg)
        self.alarm: bool | None = None  # None: ask the kernel (a drain's first job)
        self.touched = False
        self.settings = connections.settings  # DATABASES' aliases (the same dict for good)

    def see(self, raw: Any) -> None:
        pgconn = getattr(raw, "pgconn", None)
        self.raw, self.pgconn, self.params = raw, pgconn, _params(raw)
        self.status = None if pgconn is None else pgconn.parameter_status


# Django's connection of the thread running handlers, kept per thread (asgiref's lookup costs
# ~0.6 us a job; a thread's connection object is the same for its whole life, closed or open).
_thread = threading.local()
# How many times this process is a fork's child: a handler's fork is seen without a getpid().
_forks = [0]


def _forked() -> None:
    _forks[0] += 1


os.register_at_fork(after_in_child=_forked)

Before = tuple[Any, _Kept, bool, int]  # the drain's connection, its _Kept, alarm pending, _forks
_getitimer, _alarm, _REAL = signal.getitimer, signal.alarm, signal.ITIMER_REAL


def _kept() -> _Kept:
    try:
        return _thread.kept  # type: ignore[no-any-return]
    except AttributeError:
        conn: Any = connections[DEFAULT_DB_ALIAS]  # the wrapper marks its `jobs_hygiene`
        kept = _thread.kept = conn.jobs_hygiene = _Kept(conn)
        return kept


def drain_starts() -> None:
    """A drain begins on this thread: what ran before it (another django-q2 task, say) may have
    set an alarm, so its first handler's `before` asks the kernel, not what the last job left."""
    _kept().alarm = None


def _alarm_pending() -> bool:
    return _getitimer(_REAL)[0] > 0  # a system call (~0.5 us here)


def before() -> Before:
    """The connection, the process's alarm and its forks as the handler finds them. Whether an
    alarm is pending is what `after` left for the drain's previous job (only the runner's own
    code runs in between), asked of the kernel at a drain's first job: one system call a job."""
    try:
        kept = _thread.kept
    except AttributeError:
        kept = _kept()
    conn = kept.conn
    raw = conn.connection
    if raw is not kept.raw and raw is not None:
        kept.see(raw)
    conn.execute_wrappers.append(_watch)
    pending = kept.alarm
    return conn, kept, _alarm_pending() if pending is None else pending, _forks[0]


def in_forked_child(found: Before) -> bool:
    """This process is a child the handler forked (it came back into the drain)."""
    return _forks[0] != found[3]


def _open_transaction(conn: Any, raw: Any) -> str:
    if conn.in_atomic_block:
        return "inside a transaction.atomic() block it never left"
    if raw is None:
        return ""  # not connected (Django's autocommit flag means nothing until it connects)
    if not conn.autocommit:
        return "with autocommit turned off"
    pgconn = getattr(raw, "pgconn", None)
    if pgconn is not None:  # psycopg: IDLE is the only state between statements in autocommit
        status = int(pgconn.transaction_status)
        if status == _INERROR:
            return "with a failed transaction open"
        return "with a transaction open" if status != _IDLE else ""
    return "with a transaction open" if getattr(raw, "in_transaction", False) else ""


def _lost(conn: Any, raw: Any) -> bool:
    """A psycopg connection that is gone (libpq: bad status, transaction status unknown), outside
    any atomic block the handler entered by hand (that one it never left: its job fails)."""
    pgconn = getattr(raw, "pgconn", None)
    if pgconn is None or conn.in_atomic_block:
        return False
    try:
        return int(pgconn.status) != 0 or int(pgconn.transaction_status) == _UNKNOWN
    except Exception:  # noqa: BLE001  too broken to look at: _left_open says so
        return False


def _left_open(conn: Any, raw: Any) -> str:
    try:
        return _open_transaction(conn, raw)
    except Exception:  # noqa: BLE001  a connection too broken to look at is reset all the same
        return "with the connection in an unknown state"


def _other_aliases(conn: Any) -> str:
    """A transaction the handler left open on another alias of this thread (DATABASES has more
    than one): it held its locks and took in every later job's writes through that alias in
    this worker process -- or, once Django closed it there, made each of them raise -- for good.
    Reset the same way; the job fails."""
    for other in connections.all(initialized_only=True):
        if other is conn or (other.connection is None and not other.in_atomic_block):
            continue
        left = _left_open(other, other.connection)
        if left:
            _reset(other)
            return f"{left} (database {other.alias!r})"
    return ""


def after(found: Before) -> str:
    """Look at what the handler left; reset the connection if it is unfit. Returns why the job
    must fail ("" if it need not): a transaction it left open, whose writes are rolled back."""
    conn, kept, alarm_pending, _ = found
    wrappers = conn.execute_wrappers
    if wrappers and wrappers[-1] is _watch:
        wrappers.pop()
    elif _watch in wrappers:  # the handler left a wrapper of its own on top
        wrappers.remove(_watch)
    touched = kept.touched
    if touched:
        kept.touched = False
    # The one system call a job. With no alarm pending before the handler, any now is its own:
    # alarm(0) asks and cancels at once (an int back, not getitimer's tuple of floats).
    if alarm_pending:  # not the handler's (pytest-timeout's, say): looked at, left alone
        kept.alarm = _getitimer(_REAL)[0] > 0  # what the drain's next handler finds
    else:
        left_for = _alarm(0)
        if left_for:
            _cancelled_alarm(left_for)
        kept.alarm = False
    raw = conn.connection
    status = kept.status
    if (  # what nearly every job leaves: the checks below, answered in one look
        raw is kept.raw
        and status is not None  # psycopg's (its libpq), not SQLite's
        and not touched
        and conn.autocommit
        and not conn.in_atomic_block
        # IDLE: also CONNECTION_OK (libpq answers UNKNOWN for a connection gone bad)
        and kept.pgconn.transaction_status == _IDLE
        and len(kept.settings) == 1
        and status(_READ_ONLY) == kept.params[0]
        and status(_TIME_ZONE) == kept.params[1]
        and status(_AUTHORIZATION) == kept.params[2]
        and status(_DATE_STYLE) == kept.params[3]
    ):
        return ""
    if _lost(conn, raw):
        # The server ended it or the network dropped it: nothing is open on it anywhere (a
        # transaction there died with it). Unfit for the next job; not this job's failure: the
        # handler's own error, if it raised, is the job's.
        _reset(conn)
        logger.warning("the worker's connection was lost under a handler; it was closed")
        raw = None
    left = _left_open(conn, raw)
    if len(kept.settings) > 1:
        elsewhere = _other_aliases(conn)
        if elsewhere and not left:
            logger.warning(
                "a handler returned %s; rolled back and the connection closed", elsewhere
            )
            return f"the handler returned {elsewhere}: its writes there were rolled back"
    # A connection the handler opened anew (it closed the drain's) is held to the parameters
    # of the one it replaced: a new connection from the same settings reports the same ones.
    changed = not left and raw is not None and kept.raw is not None and _params(raw) != kept.params
    changed = changed or (touched and not left and conn.connection is not None)
    if not left and not changed:
        return ""
    _reset(conn)
    if changed:
        logger.warning(
            "a handler changed the session of the worker's connection (a session parameter, an "
            "advisory lock, a temporary table); it was closed so the next job starts on a fresh "
            "one (use SET LOCAL, pg_advisory_xact_lock inside a transaction instead)"
        )
        return ""
    logger.warning("a handler returned %s; rolled back and the connection closed", left)
    return f"the handler returned {left}: its writes there were rolled back"


def _cancelled_alarm(seconds: int) -> None:
    """An alarm the handler set and left pending (signal.alarm / setitimer as a deadline of its
    own, not cancelled because it raised first) would go off in a later job -- its SIGALRM
    handler's exception failing that job -- or kill the worker mid-drain (no handler): `after`
    cancelled it. One the handler found pending (not its own: pytest-timeout's, say) is left
    alone."""
    logger.warning(
        "a handler left an alarm (SIGALRM) pending for ~%d s: cancelled, so that it cannot go "
        "off in another job",
        seconds,
    )


def _reset(conn: Any) -> None:
    """Close the connection whatever Django thinks of it; the next use opens a clean one."""
    conn.in_atomic_block = False  # else close() keeps it "closed in transaction"
    conn.closed_in_transaction = False
    conn.needs_rollback = False
    try:
        conn.close()
    except Exception:  # noqa: BLE001  closing a broken connection may raise; it is gone anyway
        logger.debug("closing the handler's connection raised", exc_info=True)
    conn.connection = None


def leave_forked_child(job_id: int, attempt: int, succeeded: bool) -> NoReturn:
    """In a process the handler forked that returned, or raised, into the drain it inherited:
    it shares the worker's database connections (the same sockets) and its jobs, and went on to
    fail or commit the parent's attempt, release its batch and claim more. It exits at once,
    as `os._exit` would have (no cleanup of what it shares), with the status sys.exit() asked."""
    exc = sys.exc_info()[1]
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    else:
        code = 1 if exc is not None or not succeeded else 0
    logger.warning(
        "job %s attempt %s: process %s, forked by its handler, came back into the drain; it "
        "exits (status %s) and acts for no job (end a forked child with os._exit)",
        job_id,
        attempt,
        os.getpid(),
        code,
    )
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
