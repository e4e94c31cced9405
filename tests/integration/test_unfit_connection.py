"""A final write refused for the state of the worker's connection -- read-only (a handler's
session SET that reached the server, a failover onto a standby), SQLSTATE class 25 -- is not the
job's fault: the write is presented again on a fresh connection. Before, the completer took it
for "the database refused the handler's result" (or its error text) and failed the job, or
let the error end the drain with the attempt left to its lease. Real PostgreSQL."""

import pytest
from django.db import connection

import jobs
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_connection():
    yield
    connection.close()


def _read_only_session() -> None:
    connection.ensure_connection()
    with connection.cursor() as cur:
        cur.execute("SET default_transaction_read_only = on")


def test_a_commit_on_a_read_only_connection_lands_on_a_fresh_one():
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    _read_only_session()
    running.commit({"ok": True})
    job.refresh_from_db()
    assert (job.state, job.result, job.attempt) == ("succeeded", {"ok": True}, 1)


def test_a_failure_on_a_read_only_connection_keeps_its_own_error():
    job = jobs.enqueue("test.echo", max_attempts=1)
    running = claim("host-a:1")
    _read_only_session()
    running.fail("its own error")
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.error == "its own error"
