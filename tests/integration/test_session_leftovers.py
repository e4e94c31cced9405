"""Session state a handler leaves that PostgreSQL does not report -- `SET statement_timeout`,
`SET search_path`, `set_config(..., false)`, a session-level advisory lock, a temporary table --
and Django's per-thread `timezone.activate` / `translation.activate` end with that handler
(jobs.worker.hygiene, jobs.worker.runner): the next job on the same worker connection finds
the session as the worker had it. Before, each leaked into every later job of the worker: a
statement_timeout it never asked for, tables resolved in another schema, a lock held forever,
times shown in Tokyo. In-process drains on PostgreSQL: the handler shares the drain's
connection, as in a worker."""

import pytest
from django.db import connection
from django.utils import timezone, translation

import jobs
from jobs.worker import hygiene, runner
from tests.app.handlers import SESSION_CHANGES, session_state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _deactivate():
    yield  # a failure must not leak into later tests either
    timezone.deactivate()
    translation.deactivate()
    connection.close()


@pytest.mark.parametrize("change", [*SESSION_CHANGES, "timezone", "language"])
def test_what_a_handler_leaves_on_the_session_ends_with_it(change: str) -> None:
    expected = session_state()  # the worker's session before any handler
    leaving = jobs.enqueue("test.session", {"change": [change]}, priority=5)
    probe = jobs.enqueue("test.session")
    assert runner.drain(budget_seconds=20) == 2
    leaving.refresh_from_db()
    probe.refresh_from_db()
    assert leaving.state == probe.state == "succeeded"
    assert leaving.result == expected
    assert probe.result == expected, change
    assert session_state() == expected


def test_a_handler_that_touches_nothing_keeps_the_drains_connection() -> None:
    jobs.enqueue("test.session", {"change": []})
    connection.ensure_connection()
    raw = connection.connection
    assert runner.drain(budget_seconds=20) == 1
    assert connection.connection is raw  # no reconnect paid by a well-behaved handler


def test_a_semicolon_inside_a_literal_costs_the_handlers_connection_nothing() -> None:
    """Through the execute wrapper on the drain's connection: `'a; SET ...'` was taken for a
    SET, and the connection closed after the job (behind a pooler, the statement refused)."""
    connection.ensure_connection()
    raw = connection.connection
    found = hygiene.before()
    with connection.cursor() as cur:
        cur.execute("SELECT 'a; SET search_path = x', $$b; RESET ALL$$, E'c\\'; SET x'")
        assert cur.fetchone() == ("a; SET search_path = x", "b; RESET ALL", "c'; SET x")
    assert hygiene.after(found) == ""
    assert connection.connection is raw


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE jobs_job SET state = 'queued' WHERE id = 1",
        "SET LOCAL statement_timeout = 5",
        "set  local statement_timeout = 5",  # more than one blank: was taken for a change
        "SET\n\tLOCAL search_path = x",
        "SET  TRANSACTION READ ONLY",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SELECT pg_advisory_xact_lock(1)",
        "SELECT set_config('jobs.fence', 'on', true)",
        "SELECT 1",
        # Application tables whose names begin with "temp": were taken for SELECT ... INTO TEMP
        # (a reconnect after every such job; behind a pooler, the statement refused).
        'INSERT INTO "app_temperature" ("celsius") VALUES (21.5)',
        "INSERT INTO temperatures (celsius) VALUES (21.5)",
        "insert  into temp (n) values (1)",
        "INSERT INTO temp_readings SELECT n FROM generate_series(1, 3) n",
    ],
)
def test_statements_that_leave_nothing_on_the_session_are_not_taken_for_changes(sql: str):
    assert not hygiene.touches_session(sql)


@pytest.mark.parametrize(
    "sql",
    [
        *SESSION_CHANGES.values(),
        "set search_path = x",
        "SELECT 1; SET ROLE nobody",
        "RESET ALL",
        "DISCARD ALL",
        "LISTEN x",
        "SELECT pg_try_advisory_lock_shared(1)",
        "SELECT set_config('statement_timeout', %s, %s)",
        "CREATE GLOBAL TEMPORARY TABLE t (n int)",
        "SELECT 1 INTO TEMP t",
        "SELECT 1 INTO TEMPORARY TABLE t",
        "select n into  temp t from generate_series(1, 3) n",
        "/* app=shop */ SET search_path = x",  # a comment in front: was missed
        "-- why\nSET statement_timeout = 5",
        "SELECT 1; /* c */ SET ROLE nobody",
        "SELECT set_config('statement_timeout', '5', 'off')",
        "SELECT set_config('statement_timeout', '5', 'f'::boolean)",
        "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    ],
)
def test_statements_that_leave_state_on_the_session_are_seen(sql: str):
    assert hygiene.touches_session(sql)


def test_a_session_statement_in_a_failed_transaction_fails_with_djangos_own_error():
    """The pooler check (one query, on the first such statement of a connection) must not
    replace the handler's own error with the driver's raw one when its transaction failed."""
    from django.db import DatabaseError, transaction

    hygiene._DIRECT.clear()
    found = hygiene.before()
    try:
        with pytest.raises(DatabaseError), transaction.atomic():
            with connection.cursor() as cur:
                try:
                    cur.execute("SELECT 1/0")
                except DatabaseError:
                    pass
                cur.execute("SET search_path = public")
    finally:
        hygiene.after(found)


@pytest.mark.parametrize("compose", ["psycopg.sql", "bytes"])
def test_a_set_not_given_as_text_is_seen(compose: str) -> None:
    """A statement built with psycopg's sql module (or given as bytes) reaches the driver through
    Django's cursor as it is: the watch read only str statements, and its SET outlived the job."""
    from psycopg import sql

    statement = sql.SQL("SET statement_timeout = {}").format(sql.Literal(123456))
    connection.ensure_connection()
    found = hygiene.before()
    with connection.cursor() as cur:
        cur.execute(statement if compose == "psycopg.sql" else statement.as_string().encode())
    hygiene.after(found)
    with connection.cursor() as cur:  # a fresh session: the worker's own timeout
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone()[0] != "123456ms"


# Each of the reported session parameters the drain depends on, changed where the execute
# wrapper cannot see it: only libpq's record of what the server reported catches these.
REPORTED = {
    "default_transaction_read_only": ("on", "SHOW default_transaction_read_only"),
    "TimeZone": ("'Asia/Tokyo'", "SHOW TimeZone"),
    "DateStyle": ("'German, DMY'", "SHOW DateStyle"),
    "session_authorization": ("pg_monitor", "SELECT session_user"),
}


@pytest.mark.parametrize("through", ["driver", "server_function"])
@pytest.mark.parametrize("parameter", REPORTED)
def test_a_reported_parameter_changed_unseen_by_the_watch_still_costs_the_connection(
    parameter: str, through: str
) -> None:
    """The driver's own cursor (`connection.connection`) or a server-side statement (a DO block:
    its SET is a literal to the text watch) skips the execute wrapper; the parameter the server
    reported is compared after every job, and the connection closed (the job's work stands)."""
    value, show = REPORTED[parameter]
    sql = (
        f"SET SESSION AUTHORIZATION {value}"
        if parameter == "session_authorization"
        else f"SET {parameter} = {value}"
    )
    connection.ensure_connection()
    raw = connection.connection
    with connection.cursor() as cur:
        cur.execute(show)
        before = cur.fetchone()[0]
    found = hygiene.before()
    if through == "driver":
        raw.execute(sql)
    else:
        with connection.cursor() as cur:
            cur.execute("DO $$BEGIN EXECUTE %s; END$$" % ("'" + sql.replace("'", "''") + "'"))
    assert not raw.closed
    assert hygiene.after(found) == ""  # not the job's failure
    assert connection.connection is None and raw.closed  # the next job gets a fresh session
    with connection.cursor() as cur:
        cur.execute(show)
        assert cur.fetchone()[0] == before


def test_a_handler_that_leaves_the_reported_parameters_keeps_its_connection_job_after_job():
    """The look after each handler compares; a job that changed nothing costs no reconnect,
    also after the drain's connection was replaced (its parameters read anew)."""
    connection.ensure_connection()
    for _ in range(3):
        raw = connection.connection
        for _ in range(3):
            found = hygiene.before()
            with connection.cursor() as cur:
                cur.execute("SELECT 1")
            assert hygiene.after(found) == ""
            assert connection.connection is raw
        connection.close()
        connection.ensure_connection()
