"""The enqueue behind PgBouncer in transaction pooling (Debian's pgbouncer, a real process): its
statement is not prepared there (jobs/models/prepared.py), so an enqueue whose transaction lands
on another server session than the last one still runs -- where a prepared statement would be
missing ("prepared statement _pg3_0 does not exist")."""

import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper
from django.test.utils import override_settings

from jobs.core import enqueue as enqueue_rules
from jobs.core.states import EventType
from jobs.models import Job, JobEvent, one_statement, prepared
from tests.acceptance.test_pgbouncer import PGBOUNCER
from tests.acceptance.test_pgbouncer import pgbouncer as pgbouncer  # noqa: PLC0414 -- the fixture

pytestmark = pytest.mark.skipif(not Path(PGBOUNCER).exists(), reason="pgbouncer is not installed")


@pytest.fixture
def pooled(pgbouncer: str) -> Iterator[DatabaseWrapper]:
    """A Django connection (not in settings: only this test uses it) through the pooler."""
    port = urlsplit(pgbouncer).port
    wrapper = DatabaseWrapper({**connection.settings_dict, "PORT": port}, alias="pooled")
    try:
        yield wrapper
    finally:
        wrapper.close()


def enqueue_through(wrapper: DatabaseWrapper, n: int) -> Job:
    row, payload_json = enqueue_rules.checked("test.echo", {"n": n})
    job = one_statement.enqueue(
        Job, JobEvent, wrapper, row, enqueue_rules.UNIQUE_KEY_CONSTRAINT, payload_json
    )
    assert job is not None
    return job  # type: ignore[return-value]


def enqueue_servers() -> set[int]:
    """The server sessions whose last statement was an enqueue (not this test's own)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query LIKE 'WITH inserted AS%%'"
        )
        return {pid for (pid,) in cur.fetchall()}


def run_next_enqueue_elsewhere(pgbouncer: str, busy: set[int]) -> list[psycopg.Connection]:
    """Hold the server sessions in `busy` in open transactions of other clients of the pooler,
    so the next transaction of our client has to run on another one."""
    holders: list[psycopg.Connection] = []
    held: set[int] = set()
    for _ in range(3):  # default_pool_size = 4: leave one server for our client
        holder = psycopg.connect(pgbouncer, autocommit=False)
        holders.append(holder)
        held.add(holder.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        if busy <= held:
            return holders
    raise AssertionError(f"could not hold the server sessions {busy} (held {held})")


@pytest.mark.parametrize("setting", ["auto", "off"])
def test_behind_a_transaction_pooler_the_enqueue_is_not_prepared_and_runs_on_any_server(
    pooled, pgbouncer, setting
):
    with override_settings(JOBS={"ENQUEUE_PREPARE": setting}):
        first = enqueue_through(pooled, 1)
        busy = enqueue_servers()
        assert len(busy) == 1, busy
        holders = run_next_enqueue_elsewhere(pgbouncer, busy)
        try:
            second = enqueue_through(pooled, 2)
            assert enqueue_servers() - busy, "the second enqueue ran on the first's session"
        finally:
            for holder in holders:
                holder.close()
        assert not prepared.allowed(pooled, pooled.connection)
    for job in (first, second):
        assert Job.objects.get(pk=job.pk).payload == job.payload
        assert JobEvent.objects.filter(job=job, type=EventType.ENQUEUED).count() == 1


def pgbouncer_version() -> tuple[int, ...]:
    if not Path(PGBOUNCER).exists():
        return (0,)
    out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True).stdout
    return tuple(int(x) for x in out.split()[1].split("."))


@pytest.mark.skipif(
    pgbouncer_version() >= (1, 21), reason="PgBouncer >= 1.21 may keep prepared statements right"
)
def test_why_it_must_not_be_prepared_there_a_prepared_enqueue_breaks_on_another_session(
    pooled, pgbouncer
):
    """What "auto" avoids: forced on, the statement prepared on one server session is missing
    on the next."""
    with override_settings(JOBS={"ENQUEUE_PREPARE": "on"}):
        enqueue_through(pooled, 1)
        holders = run_next_enqueue_elsewhere(pgbouncer, enqueue_servers())
        try:
            with pytest.raises(Exception, match="prepared statement .* does not exist"):
                enqueue_through(pooled, 2)
        finally:
            for holder in holders:
                holder.close()
