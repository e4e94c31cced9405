"""Palisade behind PgBouncer in transaction pooling (Debian's pgbouncer, a real process).

LISTEN does not work through a transaction pooler (the server connection that ran LISTEN goes
back to the pool), so a worker's idle drain cannot hear the enqueue NOTIFY: it still claims every
POLL_SECONDS, and the scheduler dispatches on its poll. JOBS LISTEN_URL gives the listeners a
direct session connection instead. Either way every job runs exactly once.
"""

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection, connections

from jobs import enqueue
from jobs.core.sql.queues import WAITER_KEY, WAKE_LOCK_CLASS
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import listener, scheduler
from tests.acceptance.cluster import subprocess_database_url, wait_until
from tests.wake import waiters

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
pytestmark = pytest.mark.skipif(
    not Path(PGBOUNCER).exists(), reason="pgbouncer is not installed (bin/test installs it)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pgbouncer(transactional_db: None, request: pytest.FixtureRequest) -> Iterator[str]:
    """A pgbouncer in transaction pooling in front of the test database; yields its URL.
    Its pool holds 4 server connections, or `request.param` (indirect parametrization)."""
    pool_size = getattr(request, "param", 4)
    s = connection.settings_dict
    port = free_port()
    # a directory of its own that the postgres user can reach (pytest's tmp_path is root-only)
    work = Path(tempfile.mkdtemp(prefix="palisade-pgbouncer-"))
    (work / "users.txt").write_text(f'"{s.get("USER") or "postgres"}" ""\n')
    (work / "pgbouncer.ini").write_text(
        f"""[databases]
{s["NAME"]} = host={s.get("HOST") or "127.0.0.1"} port={s.get("PORT") or 5432} dbname={s["NAME"]}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {work / "users.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits,options
logfile = {work / "pgbouncer.log"}
"""
    )
    cmd = [PGBOUNCER, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        shutil.chown(work, "postgres")
        for f in work.iterdir():
            shutil.chown(f, "postgres")
        cmd[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = subprocess_database_url(via_port=port)

    def ready() -> bool:
        try:
            with psycopg.connect(url, connect_timeout=1) as c:
                c.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    try:
        wait_until(ready, timeout=15, what="pgbouncer to accept connections", job_id=0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def _every_job_once_through(cluster) -> None:  # type: ignore[no-untyped-def]
    burst = [enqueue("test.echo", {"n": i}) for i in range(30)]
    for job in burst:
        wait_until(
            lambda j=job: Job.objects.filter(pk=j.pk, state="succeeded").exists(),
            timeout=30,
            what="the burst to drain through pgbouncer",
            job_id=job.pk,
        )
    # now idle: no NOTIFY reaches it through the pooler; the periodic claim takes the job
    late = enqueue("test.echo", {"late": True})
    wait_until(
        lambda: Job.objects.filter(pk=late.pk, state="succeeded").exists(),
        timeout=15,
        what="a job enqueued into the idle cluster",
        job_id=late.pk,
    )
    ids = [j.pk for j in [*burst, late]]
    assert list(Attempt.objects.filter(job_id__in=ids).values_list("number", flat=True)) == [
        1
    ] * len(ids)
    assert not RejectedWrite.objects.exists()
    assert not Job.objects.exclude(state="succeeded").exists()


def test_a_cluster_behind_pgbouncer_in_transaction_pooling_runs_every_job_once(
    pgbouncer, start_qcluster
):
    # PgBouncer 1.18 keeps no prepared statements: turned off as docs/operations.md says.
    cluster = start_qcluster(DATABASE_URL=pgbouncer, JOBS_PREPARED_STATEMENTS="0")
    _every_job_once_through(cluster)
    assert "prepared statement" not in cluster.log()
    assert "Traceback" not in cluster.log()


def test_prepared_statements_left_on_behind_pgbouncer_harm_no_job(pgbouncer, start_qcluster):
    """Misconfigured (JOBS_PREPARED_STATEMENTS left on behind a pooler that keeps none): a lost
    prepared statement ran nothing, so it fails no job -- each process stops preparing and the
    log says what to set; every job still runs once."""
    cluster = start_qcluster(DATABASE_URL=pgbouncer)
    _every_job_once_through(cluster)
    assert "set JOBS_PREPARED_STATEMENTS=0" in cluster.log()
    assert "refused" not in cluster.log()


def test_listen_url_gives_the_listeners_a_direct_session(pgbouncer, start_qcluster):
    direct = subprocess_database_url() + "?application_name=palisade-listen"
    start_qcluster(DATABASE_URL=pgbouncer, JOBS_LISTEN_URL=direct, JOBS_PREPARED_STATEMENTS="0")

    def listening_directly() -> bool:
        """A session on the direct URL waits for wake-ups: it holds WAITER (queues.py)."""
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid"
                " WHERE a.application_name = 'palisade-listen' AND l.locktype = 'advisory'"
                " AND l.granted AND l.classid = %s::bigint::oid AND l.objid = %s",
                [WAKE_LOCK_CLASS, WAITER_KEY],
            )
            return bool(cur.fetchone()[0])

    wait_until(listening_directly, timeout=20, what="a LISTEN on the direct URL", job_id=0)
    job = enqueue("test.echo", {})
    wait_until(
        lambda: Job.objects.filter(pk=job.pk, state="succeeded").exists(),
        timeout=15,
        what="the job",
        job_id=job.pk,
    )


@pytest.mark.parametrize("pgbouncer", [1], indirect=True)  # one server connection for all
def test_the_main_processs_timeouts_never_reach_other_clients_through_the_pooler(pgbouncer):
    """qcluster's main process limits its own sessions' statements (scheduler.limit_session);
    through a transaction pooler that setting would stay on the pooled server connection, and
    every other client's transactions there would be cancelled after DB_TIMEOUT_SECONDS."""
    port = int(pgbouncer.rsplit(":", 1)[1].split("/", 1)[0])
    direct = connections[connection.alias]
    via = type(direct)({**direct.settings_dict, "PORT": port}, alias=connection.alias)
    try:
        via.ensure_connection()
        limited = scheduler.limit_session(via, 5000)
    finally:
        via.close()
    with psycopg.connect(pgbouncer, autocommit=True) as other:
        assert other.execute("SHOW statement_timeout").fetchone() == ("0",)
        assert other.execute("SHOW lock_timeout").fetchone() == ("0",)
    assert limited is False
    # Direct, the same call limits its own session (and only it).
    assert scheduler.limit_session(connection, 5000) is True
    with connection.cursor() as cur:
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone() == ("5s",)
        cur.execute("RESET statement_timeout; RESET lock_timeout")


def test_a_waker_behind_the_pooler_never_holds_the_waiter_lock(pgbouncer, monkeypatch):
    """Without LISTEN_URL the LISTEN goes through the pooler (and hears nothing): a session lock
    taken there would stay on a pooled server connection and make every enqueue notify, so the
    Waker registers only on a session of its own."""
    monkeypatch.setattr(
        listener,
        "listen_connection",
        lambda: psycopg.connect(pgbouncer, autocommit=True, prepare_threshold=None),
    )
    waker = listener.Waker()
    try:
        assert waker.wait(0.1)  # the fresh LISTEN
        assert not waker.wait(0.1)  # no registration: nothing to look again for
        assert not waker._waiting
        assert waiters() == 0
    finally:
        waker.close()
