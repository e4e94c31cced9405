"""The fence and the rules every fenced write of the job row follows.

Owns: `Fence` (what a worker carries after a claim), the transaction a fenced statement runs in,
and recording a rejection (job, attempt presented, attempt current, worker, which write) with its
one log line. Never: writes a job's state itself -- the transitions in worker.py, maintenance.py
and operator.py do, each through `fenced_statement()`.

Hazards: a fenced write must never join a caller's transaction (its decision would count only
once that caller commits); the one exception is SQLite's single writer, see
joining_callers_transaction(). A rejection is recorded in its own short transaction, so a
caller's rollback cannot erase it.
"""

import logging
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    transaction,
)

from jobs.core.conf import jobs_settings
from jobs.core.connectivity import direct_session
from jobs.core.exceptions import LeaseLost
from jobs.core.sql import Driver, driver_for
from jobs.core.sql.operator import rejection_context
from jobs.core.states import AttemptOutcome

logger = logging.getLogger("jobs.fencing")


@dataclass(frozen=True, init=False)
class Fence:
    """What a worker carries after a claim and presents on every write."""

    job_id: int
    attempt: int
    worker: str

    def __init__(self, job_id: int, attempt: int, worker: str) -> None:
        # One is made per claimed job: written into its __dict__ (frozen's generated __init__
        # goes through object.__setattr__ per field, twice the time); frozen all the same.
        d = self.__dict__
        d["job_id"], d["attempt"], d["worker"] = job_id, attempt, worker


class Claimed(NamedTuple):  # one per job claimed: a named tuple is built in a third of the time
    fence: Fence
    kind: str
    payload: Any
    max_attempts: int | None
    lease_seconds: float | None
    attempts_released: int = 0


def driver() -> Driver:
    return driver_for(connection.vendor)


# Set by joining_callers_transaction() (SQLite only), per thread.
_joining = threading.local()


@contextmanager
def joining_callers_transaction() -> Iterator[None]:
    """SQLite only: fenced writes in this block run inside the caller's open transaction.

    SQLite has one writer. While a handler's transaction is open (IMMEDIATE) it holds the
    database's only write lock, so a fenced write on another connection would wait for the
    handler's COMMIT, which waits for that write: stuck until the busy timeout, then "database is
    locked". Joining is sound on SQLite alone: no other connection can change the job row until
    the caller's transaction ends, so the fenced statement decides against the row as it stands
    at the caller's COMMIT. A rejection is *not* recorded inside (the caller's rollback would
    erase it): it raises LeaseLost, and the caller records it with record_rejected() once its
    transaction is over.
    """
    if connection.vendor != "sqlite":
        raise RuntimeError("only SQLite's single writer makes joining a transaction sound")
    _joining.active = True
    try:
        yield
    finally:
        _joining.active = False


def joined(conn: Any = None) -> bool:
    """Inside joining_callers_transaction() and the caller's atomic block (`conn`: Django's
    connection of this thread, if the caller has it at hand)."""
    if not getattr(_joining, "active", False):
        return False
    return bool((conn or connection).in_atomic_block)


@contextmanager
def fenced_statement() -> Iterator[None]:
    """The transaction a fenced write runs in.

    On PostgreSQL every transition run here is one statement (data-modifying CTEs carry its
    Attempt and event rows), atomic on its own: running it in autocommit saves the BEGIN and
    COMMIT round trips (about 30% of drain throughput). SQLite's driver issues several
    statements, so it gets a real transaction. Either way the job, its attempt and its events
    change together or not at all. A fenced write must never
    join a caller's transaction -- its decision would count only once that caller commits, and
    the job row's lock would last as long as the caller's work -- so inside an atomic block it
    runs as `atomic(durable=True)`, which refuses that (Django's TestCase blocks excepted).
    The one exception is SQLite inside joining_callers_transaction() (see there): a savepoint.
    """
    # Django's connection of this thread, looked up once: each `connection.x` goes through
    # Django's per-thread proxy, and this runs twice per batch on the drain's hot path.
    conn = connections[DEFAULT_DB_ALIAS]
    if joined(conn):
        with transaction.atomic():
            yield
    elif conn.in_atomic_block:
        with transaction.atomic(durable=True):
            yield
    elif driver_for(conn.vendor).single_statement_writes:
        yield
    else:
        with transaction.atomic():
            yield


# A hot statement text is prepared on its second execution (a one-off text -- a commit carrying
# intents, say -- is not worth the extra round trip a first preparation costs).
PREPARE_THRESHOLD = 1
# SQLSTATEs of a prepared statement the server connection does not have (or has twice): what a
# transaction pooler that keeps no prepared statements (PgBouncer before 1.21) causes.
_LOST_PREPARED = frozenset({"26000", "42P05"})
# Set once this process met one of those: from then on nothing is prepared here.
_preparing_refused = threading.Event()
# psycopg's cap on prepared statements for a connection that ran hot statements (its default is
# 100): each new plan generation (jobs/core/sql/plans.py) prepares the hot texts again, and
# psycopg deallocates the least recently used -- an older generation's -- as each new text first
# runs, so the connection keeps this many plus the newest generation's. A claim's or commit's
# plan holds about 220 kB of the server's memory.
HOT_PREPARED_MAX = 32


@contextmanager
def hot_cursor() -> Iterator[Any]:
    """A cursor for the drain's hot statements (claim, heartbeat, commit, fail, release).

    On PostgreSQL it binds parameters on the server and prepares each statement text once per
    connection (Django's default cursor interpolates the parameters into the text and prepares
    nothing), and PostgreSQL then reuses the statement's generic plan: the claim and the commit
    are parsed and planned once per connection instead of on every batch (planning was about
    half of their server time) -- once, not five times: `_plan_once`. It is still Django's
    cursor wrapper on Django's connection: errors become django.db errors, execute wrappers and
    query logging apply. Only these statements are prepared: the connection's own
    `prepare_threshold` (Django's default: None, nothing prepared) is back in force for every
    other cursor once this one is done. psycopg keeps at most `prepared_max` (100) statements
    per connection. JOBS["PREPARED_STATEMENTS"] = False, or SQLite: Django's cursor.

    Behind a transaction pooler that keeps no prepared statements, a statement prepared on one
    server connection is executed on another. Names are random per connection, so it can never
    run another client's statement of the same name: the server answers "does not exist" and
    has run nothing. That error is raised as an OperationalError (an outcome the worker re-reads
    and presents again, never a refusal that fails a job) and this process prepares nothing from
    then on; the log says to set JOBS_PREPARED_STATEMENTS=0.
    """
    conn = connections[DEFAULT_DB_ALIAS]  # this thread's, looked up once (see fenced_statement)
    if (
        conn.vendor != "postgresql"
        or not jobs_settings().PREPARED_STATEMENTS
        or _preparing_refused.is_set()
    ):
        with conn.cursor() as cur:
            yield cur
        return
    from django.db.backends.postgresql.base import ServerBindingCursor

    conn.ensure_connection()
    conn.validate_thread_sharing()
    raw = conn.connection
    if not _names_are_random(raw):
        with conn.cursor() as cur:
            yield cur
        return
    if not getattr(raw, "_jobs_plan_once", False) and not conn.in_atomic_block:
        _plan_once(conn, raw)
    if raw.prepared_max is None or raw.prepared_max > HOT_PREPARED_MAX:  # None: unlimited
        raw.prepared_max = HOT_PREPARED_MAX
    with conn.wrap_database_errors:
        cursor: Any = ServerBindingCursor(raw)  # type: ignore[call-arg]  # (django-stubs)
    wrapped = conn.make_debug_cursor(cursor) if conn.queries_logged else conn.make_cursor(cursor)
    saved = raw.prepare_threshold
    raw.prepare_threshold = PREPARE_THRESHOLD if saved is None else saved
    try:
        with wrapped as cur:
            yield cur
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) not in _LOST_PREPARED:
            raise
        _preparing_refused.set()
        logger.error(
            "the database connection lost a prepared statement (%s): a transaction pooler that "
            "keeps none? This process prepares nothing from now on; set "
            "JOBS_PREPARED_STATEMENTS=0 (docs/operations.md, PgBouncer)",
            exc,
        )
        raise OperationalError(f"prepared statement lost, nothing ran: {exc}") from exc
    finally:
        if not raw.closed:
            raw.prepare_threshold = saved


# Makes the session plan a prepared statement once, its generic plan at its first execution,
# where PostgreSQL would make a custom plan for each of its first five (plan_cache_mode auto):
# the claim's batch size is a parameter (1, 2, 4, ... as a drain starts: one text, planned
# once), and the commit is planned once per connection and plan generation.
_PLAN_ONCE = "SET plan_cache_mode = force_generic_plan"


def _plan_once(conn: Any, raw: Any) -> None:
    """Once per connection, in autocommit (a transaction's rollback would undo it). Not where
    Django's cursors bind parameters on the server (OPTIONS server_side_binding): the
    application's own statements on this connection would be planned generically too. Django's
    default cursors send their values in the text, which PostgreSQL plans for those values
    whatever this says (a statement without parameters has no custom plan to make). Only on a
    direct session (connectivity.direct_session): behind a pooler the setting would stay on a
    server connection other clients use."""
    raw._jobs_plan_once = True
    if conn.settings_dict.get("OPTIONS", {}).get("server_side_binding"):
        return
    with conn.wrap_database_errors:
        if direct_session(raw):
            raw.execute(_PLAN_ONCE, prepare=False)


def _names_are_random(raw: Any) -> bool:
    """Start this connection's prepared-statement names at a random number (psycopg numbers
    them from 0 on every connection), so that two clients sharing a pooled server connection
    never hold the same name. False if psycopg no longer numbers them this way."""
    if getattr(raw, "_jobs_random_names", False):
        return True
    manager: Any = getattr(raw, "_prepared", None)
    if not isinstance(getattr(manager, "_prepared_idx", None), int):
        return False
    if manager._prepared_idx == 0:  # nothing prepared on it yet
        manager._prepared_idx = secrets.randbits(60)
    raw._jobs_random_names = True
    return True


def row_refused(exc: DatabaseError) -> bool:
    """True when the database refused the statement's data, not when the connection failed."""
    return not isinstance(exc, OperationalError | InterfaceError)


def attempt_outcome(fence: Fence) -> str | None:
    """The outcome the database holds for this attempt (None: no such attempt row)."""
    with connection.cursor() as cur:
        return driver().read_attempt_outcome(cur, fence.job_id, fence.attempt)


def landed(fence: Fence, outcome: str) -> bool:
    # Only this attempt's own write sets its outcome to `outcome`; the job's state alone cannot
    # tell (a reaper's requeue and a retrying fail both leave it queued at the same attempt).
    return attempt_outcome(fence) == outcome


def record(fence: Fence, write: str, outcome: str | None) -> tuple[int, str] | None:
    """Store the rejected write (and end its attempt with `outcome`), then log it: the one line
    per stored rejection. A connection lost during the COMMIT leaves its outcome unknown: the
    row is looked for on a new connection, and logged if it landed (else the error stands)."""
    found: tuple[int, str, int] | None = None
    kind: str = ""
    lateness: float | None = None
    try:
        with transaction.atomic(), connection.cursor() as cur:
            d = driver()
            found = d.record_rejection(cur, fence.job_id, fence.attempt, fence.worker, write)
            kind, lateness = rejection_context(d, cur, fence.job_id, fence.attempt)
            if outcome is not None:
                d.end_attempt(cur, fence.job_id, fence.attempt, outcome)
    except (OperationalError, InterfaceError):
        if not rejection_landed(found[2] if found else None):
            raise
    current = (found[0], found[1]) if found else None
    attempt_current, state_current = current if current else (None, "deleted")
    fields = {
        "event": "stale_write_rejected",
        "write": str(write),
        "job_id": fence.job_id,
        "kind": kind,
        "attempt_presented": fence.attempt,
        "attempt_current": attempt_current,
        "state_current": str(state_current),
        "worker": fence.worker,
        # Seconds since this attempt's last accepted heartbeat (database clock).
        "lateness_seconds": lateness,
    }
    logger.warning(
        "stale %(write)s rejected: job=%(job_id)s kind=%(kind)s "
        "attempt_presented=%(attempt_presented)s attempt_current=%(attempt_current)s "
        "state_current=%(state_current)s worker=%(worker)s lateness=%(lateness_seconds)ss",
        fields,
        extra={"fields": fields},
    )
    return current


def rejection_landed(row_id: int | None) -> bool:
    """After the connection was lost while a rejection's own transaction ended: whether its row
    `row_id` (None: not inserted) was committed, read on a new connection. False inside a
    caller's transaction (nothing of it has committed yet) and when the row cannot be read either
    (the outcome stays unknown; the caller's error stands). The one decision for
    `record` here and jobs.effects.fenced.record_rejection."""
    if row_id is None or connection.in_atomic_block:
        return False
    try:
        connection.close()
        with connection.cursor() as cur:
            return driver().rejection_exists(cur, row_id)
    except (OperationalError, InterfaceError):
        return False


def record_rejected(fence: Fence, write: str) -> None:
    """Record a rejection seen inside a caller's transaction, once that transaction is over."""
    record(fence, write, AttemptOutcome.LOST)


def rejected(fence: Fence, write: str, outcome: str) -> None:
    if not joined():  # joined: the caller records it after its transaction (see above)
        record(fence, write, outcome)
    raise LeaseLost(fence.job_id, fence.attempt, write)
