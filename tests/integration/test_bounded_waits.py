"""Every platform round trip has a deadline, and a silent LISTEN connection is noticed.

Through the fault-injecting proxy in hold mode: the sockets stay open and the proxy's kernel
acknowledges every byte, so neither TCP keepalives nor tcp_user_timeout can tell -- only a
client-side deadline.
"""

import time
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connection

import jobs
from jobs.core.connectivity import bounded
from jobs.worker import listener, scheduler
from tests.integration.pgproxy import PgProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxied(settings) -> Iterator[PgProxy]:
    """Route Django's connections (and the scheduler's LISTEN one) through the proxy."""
    settings.JOBS = {**settings.JOBS, "DB_TIMEOUT_SECONDS": 0.5}
    db = connection.settings_dict
    host, port, options = db["HOST"] or "127.0.0.1", db["PORT"] or 5432, dict(db["OPTIONS"])
    proxy = PgProxy(host, int(port))
    connection.close()
    db["HOST"], db["PORT"] = "127.0.0.1", proxy.port
    db["OPTIONS"] = {**options, "connect_timeout": 2}
    try:
        yield proxy
    finally:
        proxy.heal()
        connection.close()
        db["HOST"], db["PORT"], db["OPTIONS"] = host, port, options
        proxy.close()


def test_a_round_trip_to_a_silent_database_fails_within_its_deadline(proxied):
    with connection.cursor() as cur:
        cur.execute("SELECT 1")  # connected through the proxy
    proxied.hold()
    started = time.monotonic()
    with pytest.raises(OperationalError, match="no answer within 0.5 s"):
        with bounded("a test query"), connection.cursor() as cur:
            cur.execute("SELECT 1")
    assert time.monotonic() - started < 2.0


def test_a_silent_listen_connection_is_noticed_and_listening_resumes(proxied, monkeypatch):
    monkeypatch.setattr(listener, "LIVENESS_SECONDS", 0.2)
    waker = listener.Waker()
    try:
        waker.wait(0.05)
        assert waker._conn is not None  # listening, through the proxy
        proxied.hold()  # half-open: the server is gone to us, the socket still open
        deadline = time.monotonic() + 10
        while waker._conn is not None:
            assert time.monotonic() < deadline, "the silent LISTEN connection went unnoticed"
            waker.wait(0.1)
        proxied.reset()
        connection.close()
        deadline = time.monotonic() + 10
        while waker._conn is None:
            assert time.monotonic() < deadline, "LISTEN was not re-established"
            waker.wait(0.1)
        jobs.enqueue("test.echo")  # its trigger NOTIFYs on commit
        deadline = time.monotonic() + 5
        while not waker.wait(0.2):
            assert time.monotonic() < deadline, "no wake-up after the LISTEN came back"
    finally:
        waker.close()


def test_the_scheduler_process_has_server_side_statement_and_lock_timeouts(settings):
    from django.db.backends.signals import connection_created

    settings.JOBS = {**settings.JOBS, "DB_TIMEOUT_SECONDS": 0.5}
    connection.close()
    scheduler.limit_statements_of_this_process()
    try:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
            )
            assert cur.fetchone() == ("500ms", "250ms")
            with pytest.raises(OperationalError, match="statement timeout"):
                cur.execute("SELECT pg_sleep(3)")
    finally:
        connection_created.disconnect(dispatch_uid="jobs.scheduler.limit")
        connection.close()
