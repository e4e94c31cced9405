"""Which of the handler's ctx calls the platform's round-trip deadline (JOBS_DB_TIMEOUT_SECONDS,
jobs.core.connectivity) cuts, as the README's Layout says: the platform's own short writes
(a heartbeat, a checkpoint, the effect ledger's) are cut when they wait past it; a token-checked
write (`fenced_write`, `fenced_create`, `fenced_delete`) runs on the handler's own connection,
like its queries, and may wait on the application's row locks for as long as they are held."""

import threading
import time

import pytest
from django.db import OperationalError, connection

import jobs
from demo.models import Report
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 1.0


@pytest.fixture(autouse=True)
def _short_deadline(settings):
    settings.JOBS = {**settings.JOBS, "DB_TIMEOUT_SECONDS": DEADLINE}


def _waiting_on_a_lock(second_connection, within: float = 10.0) -> None:
    """Until a backend other than `second_connection` waits on a lock."""
    deadline = time.monotonic() + within
    while True:
        second_connection.execute("SELECT pg_stat_clear_snapshot()")  # read afresh in a transaction
        row = second_connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND pid <> pg_backend_pid() AND datname = current_database()"
        ).fetchone()
        if row[0]:
            return
        assert time.monotonic() < deadline, "no backend ever waited on the lock"
        time.sleep(0.02)


@pytest.mark.parametrize("call", ["checkpoint", "heartbeat", "effect begin", "effect finish"])
def test_a_platform_write_waiting_past_the_deadline_is_cut(second_connection, call):
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")

    def hold_the_job_row() -> None:
        second_connection.execute("BEGIN")
        second_connection.execute("SELECT 1 FROM jobs_job WHERE id = %s FOR UPDATE", [job.pk])

    def fn(key: str) -> str:  # the effect's call: the ledger's finish comes next
        hold_the_job_row()
        return key

    if call != "effect finish":
        hold_the_job_row()
    write = {
        "checkpoint": lambda: running.ctx.checkpoint({"page": 1}),
        "heartbeat": running.ctx.heartbeat,
        "effect begin": lambda: running.ctx.effect("charge", lambda key: key),
        "effect finish": lambda: running.ctx.effect("charge", fn),
    }[call]
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError, match="no answer within"):
            write()
        assert time.monotonic() - started < DEADLINE + 5
    finally:
        second_connection.execute("ROLLBACK")
        connection.close()  # the cut connection; the next query opens another


def test_a_fenced_write_waiting_on_the_applications_lock_is_not_cut(second_connection):
    report = Report.objects.create(name="daily")
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    second_connection.execute("BEGIN")  # the application's own transaction holds the row
    second_connection.execute("SELECT 1 FROM demo_report WHERE id = %s FOR UPDATE", [report.pk])
    done: list[object] = []

    def write() -> None:
        try:
            done.append(running.ctx.fenced_write(Report.objects.filter(pk=report.pk), body="x"))
        except BaseException as exc:  # noqa: BLE001  reported below
            done.append(exc)
        finally:
            connection.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        _waiting_on_a_lock(second_connection)
        writer.join(DEADLINE * 3)  # well past the deadline: still waiting, not cut
        assert writer.is_alive() and not done
    finally:
        second_connection.execute("COMMIT")
    writer.join(10)
    assert done == [1]
    report.refresh_from_db()
    assert report.body == "x"
