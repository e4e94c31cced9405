"""Invariant 10: a commit whose outcome is unknown is resolved by re-reading on a new connection."""

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connection

import jobs
from jobs.core import transitions
from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Job, RejectedWrite
from jobs.worker import completer, reaper, runner
from tests.integration.pgproxy import PgProxy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def proxied() -> Iterator[PgProxy]:
    """Route Django's connection through a proxy that can cut it during the commit."""
    settings = connection.settings_dict
    host, port = settings["HOST"] or "127.0.0.1", settings["PORT"] or 5432
    proxy = PgProxy(host, int(port))
    connection.close()
    settings["HOST"], settings["PORT"] = "127.0.0.1", proxy.port
    try:
        yield proxy
    finally:
        connection.close()
        settings["HOST"], settings["PORT"] = host, port
        proxy.close()


# The commit statement (autocommit on PostgreSQL: it commits as it runs).
COMMIT_MARKER = b"state = 'succeeded'"


def claimed_fence():
    jobs.enqueue("test.echo")
    (claimed,) = transitions.claim("host-a:1", lease_seconds=30)
    return claimed.fence


def commit_resolving(fence, result):
    completer.present_until_decided(
        [fence], lambda fences: transitions.commit(fence, result), AttemptOutcome.SUCCEEDED
    )


def test_a_commit_that_landed_before_the_connection_died_is_reported_as_landed(proxied, caplog):
    fence = claimed_fence()
    proxied.cut_on(COMMIT_MARKER, after_reply=True)
    commit_resolving(fence, {"v": 1})
    assert proxied.cuts == 1
    job = Job.objects.get(pk=fence.job_id)
    assert (job.state, job.attempt, job.result) == (JobState.SUCCEEDED, 1, {"v": 1})
    assert not RejectedWrite.objects.exists()
    assert any("the write had landed" in r.getMessage() for r in caplog.records)


def test_a_commit_lost_with_its_connection_is_presented_again_and_lands(proxied):
    fence = claimed_fence()
    proxied.cut_on(COMMIT_MARKER, after_reply=False)
    commit_resolving(fence, {"v": 2})
    assert proxied.cuts == 1
    job = Job.objects.get(pk=fence.job_id)
    assert (job.state, job.result) == (JobState.SUCCEEDED, {"v": 2})
    assert not RejectedWrite.objects.exists()


def test_a_lost_commit_whose_job_moved_on_is_rejected_not_forced(proxied, second_connection):
    fence = claimed_fence()
    proxied.cut_on(COMMIT_MARKER, after_reply=False)

    def commit_then_lose_the_job(fences):
        try:
            transitions.commit(fence, "zombie")
        finally:
            # Meanwhile the job was reclaimed and claimed again elsewhere.
            second_connection.execute(
                "UPDATE jobs_job SET attempt = 2 WHERE id = %s", [fence.job_id]
            )

    with pytest.raises(jobs.LeaseLost):
        completer.present_until_decided([fence], commit_then_lose_the_job, AttemptOutcome.SUCCEEDED)
    job = Job.objects.get(pk=fence.job_id)
    assert (job.state, job.attempt) == (JobState.RUNNING, 2)
    assert RejectedWrite.objects.get(job=job).attempt_presented == 1


# The failure statement (autocommit: it commits as it runs).
FAIL_MARKER = b"WITH failed AS"


def test_a_lost_failure_is_not_taken_for_landed_when_the_reaper_left_the_same_state(
    proxied, second_connection
):
    """A retrying fail and the reaper's requeue both leave the job queued at attempt 1: only the
    attempt's own row tells whether the failure landed."""
    fence = claimed_fence()
    proxied.cut_on(FAIL_MARKER, after_reply=False)

    presentations = []

    def fail_while_the_reaper_requeues(fences):
        presentations.append(fence)
        if len(presentations) > 1:  # the re-presentation: the reaper has already acted
            transitions.fail(fence, "boom", 30.0)
            return
        try:
            transitions.fail(fence, "boom", 30.0)
        finally:
            second_connection.execute(
                "UPDATE jobs_job SET lease_expires_at = clock_timestamp() - interval '1 second' "
                "WHERE id = %s",
                [fence.job_id],
            )
            connection.close()
            assert reaper.reap("reaper:1") == 1

    with pytest.raises(jobs.LeaseLost):
        completer.present_until_decided(
            [fence], fail_while_the_reaper_requeues, AttemptOutcome.FAILED
        )
    assert proxied.cuts == 1
    job = Job.objects.get(pk=fence.job_id)
    assert (job.state, job.attempt, job.error) == (JobState.QUEUED, 1, "")
    assert Attempt.objects.get(job=job, number=1).outcome == AttemptOutcome.EXPIRED
    assert RejectedWrite.objects.get(job=job).write == "fail"


# -- a rejection's own record: stored and logged once, whatever its COMMIT met ------------------

REJECTION_COMMIT = b"COMMIT"


def test_a_rejection_record_whose_commit_landed_before_the_connection_died_is_logged(
    proxied, caplog
):
    # Found by the fault-injection suite: the row was stored, its COMMIT's reply was cut, and the
    # heartbeat thread retried without the line -- a stored rejection never logged.
    fence = claimed_fence()
    proxied.cut_on(REJECTION_COMMIT, after_reply=True)
    transitions.record_lost_heartbeat(fence)
    assert proxied.cuts == 1
    assert RejectedWrite.objects.filter(job_id=fence.job_id, write="heartbeat").count() == 1
    lines = [r.getMessage() for r in caplog.records if "stale heartbeat rejected" in r.getMessage()]
    assert len(lines) == 1 and f"job={fence.job_id}" in lines[0]


def test_a_rejection_record_whose_commit_never_arrived_raises_and_logs_nothing(proxied, caplog):
    from django.db import OperationalError

    fence = claimed_fence()
    proxied.cut_on(REJECTION_COMMIT, after_reply=False)
    with pytest.raises(OperationalError):
        transitions.record_lost_heartbeat(fence)
    connection.close()
    assert not RejectedWrite.objects.filter(job_id=fence.job_id).exists()
    assert not [r for r in caplog.records if "stale heartbeat rejected" in r.getMessage()]


def test_a_token_write_rejection_whose_commit_landed_before_the_connection_died_is_logged(
    proxied, caplog
):
    from jobs.effects import fenced

    fence = claimed_fence()
    proxied.cut_on(REJECTION_COMMIT, after_reply=True)
    fenced.record_rejection(fence, "token_write", "demo.Report:1", None)
    assert proxied.cuts == 1
    assert RejectedWrite.objects.filter(job_id=fence.job_id, write="token_write").count() == 1
    assert [r for r in caplog.records if "stale token_write rejected" in r.getMessage()]


# -- a confirmed job's commit, on the runner's own thread ----------------------------------------


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_confirmed_jobs_commit_left_unknown_is_spooled_and_never_blamed_on_its_handler(
    proxied, settings, tmp_path, swap_handler, caplog
):
    """The commit lands, its reply is lost and the database stays away past
    UNKNOWN_OUTCOME_SECONDS: the write is spooled and the drain ends with the error -- the job
    is not failed with "handler raised OperationalError" (then rejected, its outputs deleted,
    once the database was back)."""
    spool = tmp_path / "spool"
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.JOBS = {**settings.JOBS, "UNRESOLVED_DIR": str(spool), "UNKNOWN_OUTCOME_SECONDS": 1.0}

    def confirmed_then_done(ctx):
        ctx.stage("out.txt", "the result")
        deadline = time.monotonic() + 10
        while not ctx._held.confirmed and time.monotonic() < deadline:  # a beat confirms it
            time.sleep(0.01)
        return {"confirmed": ctx._held.confirmed}

    swap_handler("test.echo", confirmed_then_done)
    job = jobs.enqueue("test.echo", lease_seconds=1.5)  # beaten every 0.5 s
    upstream = proxied.upstream

    def database_back_once_the_write_is_spooled():
        deadline = time.monotonic() + 30
        while not list(spool.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.01)
        proxied.upstream = upstream

    # Away at the moment of the cut, before the runner can see it: a re-read never reaches the
    # database (a test thread switching the upstream after the cut raced that re-read, and a
    # hold applied after its reset left the proxy silent: "connection timeout expired").
    proxied.cut_on(COMMIT_MARKER, after_reply=True, then_away=("127.0.0.1", _unused_port()))
    outage = threading.Thread(target=database_back_once_the_write_is_spooled)
    outage.start()
    try:
        with pytest.raises(OperationalError):
            runner.drain()
    finally:
        outage.join()
    job.refresh_from_db()
    assert (job.state, job.result, job.error) == (JobState.SUCCEEDED, {"confirmed": True}, "")
    assert (tmp_path / "media" / job.result_ref / "out.txt").read_text() == "the result"
    assert not RejectedWrite.objects.filter(job=job).exists()
    assert Attempt.objects.get(job=job).outcome == AttemptOutcome.SUCCEEDED
    assert [p.name for p in spool.glob("*.json")] == [f"job-{job.pk}-attempt-1-succeeded.json"]
    assert not [r for r in caplog.records if "handler raised" in r.getMessage()]
