"""Whether the enqueue statement may be a server-side prepared statement on a connection.

Owns: that decision, once per psycopg connection (JOBS['ENQUEUE_PREPARE']). Never: prepares
anything itself -- jobs/models/one_statement.py passes the answer to psycopg's `prepare=`.

Why it needs deciding: a prepared statement lives in one server session, and psycopg names them
`_pg3_0`, `_pg3_1`, ... per client connection. Behind a transaction pooler (PgBouncer in
`pool_mode = transaction` before 1.21, or without `max_prepared_statements`) a client's
transactions run on whichever server session is free, where the statement is missing ("prepared
statement does not exist", which aborts the caller's transaction) or is another client's
statement of the same name. So, with "auto" (the default), the statement is prepared only when
the connection reaches PostgreSQL itself, told by:

- the backend pid PostgreSQL reports (`pg_backend_pid()`) equals the one the connection's
  start-up message gave (psycopg's `info.backend_pid`): a pooler answers the start-up itself
  and makes that pid up (PgBouncer does; so do pgcat and Odyssey) -- one query per new
  connection, on its first enqueue;
- and the database's `DISABLE_SERVER_SIDE_CURSORS` is not set (Django's documented setting for
  transaction pooling).

"on" prepares whatever the connection (a pooler that keeps protocol-level prepared statements
right, e.g. PgBouncer >= 1.21 with `max_prepared_statements` > 0); "off" never does.

How: Django opens psycopg connections with `prepare_threshold = None`, which makes psycopg ignore
even `prepare=True` -- and Django's own (client-side binding) cursors never prepare anyway. So
`execute()` lends the connection a threshold for the one call and gives the old value back:
psycopg's own cache then names, prepares once and reuses the statement, and nothing else on the
connection changes. Hazard: psycopg forgets its statements (and deallocates them) on a rollback
or a DROP/ALTER it sees; a `DEALLOCATE ALL` or `DISCARD ALL` sent by the application through
Django's cursors is not seen, and every later enqueue on that connection fails with "prepared
statement does not exist" until the connection is closed (inside a transaction, until its
rollback) -- set "off" if the application does that
(tests/integration/test_enqueue_prepared.py).
"""

import weakref
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from jobs.core.conf import jobs_settings
from jobs.core.connectivity import direct_session
from jobs.core.exceptions import InvalidOption

CHOICES = {"auto": None, "on": True, "true": True, "1": True}
CHOICES |= {"off": False, "false": False, "0": False}

# psycopg connection -> whether it reaches PostgreSQL directly (asked once per connection).
_DIRECT: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def setting() -> bool | None:
    """JOBS['ENQUEUE_PREPARE'] as True (on), False (off) or None (auto)."""
    raw = str(jobs_settings().ENQUEUE_PREPARE).strip().lower()
    if raw not in CHOICES:
        raise InvalidOption(
            f"JOBS['ENQUEUE_PREPARE'] = {raw!r}: use 'auto' (the default), 'on' or 'off'"
        )
    return CHOICES[raw]


def allowed(conn: BaseDatabaseWrapper, raw: Any) -> bool:
    """Whether the enqueue may be prepared on `raw`, Django connection `conn`'s psycopg
    connection (open; inside the caller's transaction if any: the pid query is harmless).
    JOBS['PREPARED_STATEMENTS'] = False (JOBS_PREPARED_STATEMENTS=0) turns every prepared
    statement of Palisade off, this one too, whatever ENQUEUE_PREPARE says."""
    chosen = setting()  # read first: a bad value is refused even when everything is off
    if not jobs_settings().PREPARED_STATEMENTS:
        return False
    if chosen is not None:
        return chosen
    if conn.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return False
    direct = _DIRECT.get(raw)
    if direct is None:
        direct = _DIRECT[raw] = direct_session(raw)
    return direct


def execute(raw: Any, cur: Any, sql: str, params: list[Any]) -> None:
    """`cur.execute(sql, params)` as a prepared statement on `raw` (psycopg's cache)."""
    threshold = raw.prepare_threshold
    raw.prepare_threshold = 0 if threshold is None else threshold
    try:
        cur.execute(sql, params, prepare=True)
    finally:
        raw.prepare_threshold = threshold
