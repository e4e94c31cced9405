"""Migration 0026 (the keys onto jobs_job made ON DELETE RESTRICT) on a live database: dropping a
foreign key locks jobs_job ACCESS EXCLUSIVE -- no claim, commit, enqueue or read of it -- so
that lock must last one key's swap, not the whole migration."""

import importlib
import threading
import time

import psycopg
import pytest
from django.db import connection

from tests.conftest import raw_connection

MIGRATION = importlib.import_module("jobs.migrations.0026_restrict_job_deletes")


def lock_waiters(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction it is cached
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0]) if row else 0


def key_actions() -> dict[str, tuple[str, bool]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conrelid::regclass::text, confdeltype, convalidated FROM pg_constraint "
            "WHERE contype = 'f' AND confrelid = 'jobs_job'::regclass"
        )
        ours = {table for table, _column in MIGRATION.REFERENCES}
        return {t: (action, valid) for t, action, valid in cur.fetchall() if t in ours}


@pytest.mark.django_db(transaction=True)
def test_migration_0026_holds_the_job_table_only_for_each_key_s_swap(second_connection):
    """The migration is run as `migrate` runs it (its own `atomic`) while a report holds the
    second referencing table: the migration waits for it, and meanwhile jobs_job is free, not
    locked since the first key's drop (in one transaction, every read of the job table waited
    for the report)."""
    before = key_actions()
    second_connection.execute("BEGIN")
    second_connection.execute("LOCK TABLE jobs_rejectedwrite IN ACCESS SHARE MODE")
    failures: list[BaseException] = []

    def migrate() -> None:
        try:
            with connection.schema_editor(atomic=MIGRATION.Migration.atomic) as editor:
                MIGRATION.forwards(None, editor)
        except BaseException as exc:  # noqa: BLE001 -- the test reads it
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=migrate, daemon=True)
    thread.start()
    reader = raw_connection()
    try:
        deadline = time.monotonic() + 10
        while not lock_waiters(second_connection):
            assert time.monotonic() < deadline, "the migration never waited for the report"
            time.sleep(0.01)
        reader.execute("SET lock_timeout = '2s'")
        # A read of the job table (a claim's, the dashboard's) goes on while the migration waits.
        assert reader.execute("SELECT count(*) FROM jobs_job").fetchone() is not None
    finally:
        second_connection.execute("ROLLBACK")
        reader.close()
        thread.join(30)
    assert not thread.is_alive() and not failures, failures
    assert key_actions() == before  # the same keys, RESTRICT and valid, as the migration left them
    assert len(before) == 5 and set(before.values()) == {("r", True)}
