"""Stopping qcluster the way process supervisors do."""

import os
import signal
import time

import pytest

from jobs import enqueue
from jobs.models import Attempt
from tests.acceptance.cluster import (
    POLL_SECONDS,
    subprocess_database_url,
    wait_for_attempt,
    wait_for_outcome,
    wait_for_rejection,
    wait_for_state,
    wait_until,
    worker_pid,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_whole_process_group_stops_every_process(start_qcluster, sig):
    """systemd's default stop (KillMode=control-group) and a terminal's Ctrl-C signal every
    process of the group at once, the sentinel and workers included."""
    cluster = start_qcluster()
    job = enqueue("test.echo")
    wait_for_state(job.pk, "succeeded")  # the cluster is up and has run work
    os.killpg(cluster.pgid, sig)
    deadline = time.monotonic() + 15
    while not group_gone(cluster.pgid):
        if time.monotonic() > deadline:
            pytest.fail(f"qcluster group still alive 15 s after {sig.name}:\n{cluster.log()}")
        cluster.proc.poll()  # reap the command once it exits
        time.sleep(POLL_SECONDS)


# -- the shutdown policy: stop claiming, a grace period, then a fenced hand-back ---------------

GRACE_SECONDS = 2.0
SHUTDOWN_MARGIN_SECONDS = 5.0  # jobs/management/commands/qcluster.py


def wait_gone(cluster, seconds: float) -> float:
    """Seconds until every process of the cluster's group has exited (fails after `seconds`)."""
    started = time.monotonic()
    while not group_gone(cluster.pgid):
        if time.monotonic() - started > seconds:
            pytest.fail(f"qcluster group still alive {seconds} s after SIGTERM:\n{cluster.log()}")
        cluster.proc.poll()  # reap the command once it exits
        time.sleep(POLL_SECONDS)  # the poll interval of a deadline-bound wait
    return time.monotonic() - started


def test_sigterm_hands_a_job_longer_than_the_grace_period_to_another_worker_at_once(
    start_qcluster,
):
    """SIGTERM to the main process (docker stop, Kubernetes, kill PID) with a 60 s job running
    and a 2 s grace: nothing more is claimed, the job is handed back by a fenced release when
    the grace ends and another cluster takes it at once (its lease of 60 s plays no part), the
    abandoned handler's next write is rejected and recorded, and the process group is gone."""
    from jobs.management.commands.qcluster import descendants

    leaving = start_qcluster(JOBS_SHUTDOWN_GRACE_SECONDS=str(GRACE_SECONDS))
    job = enqueue(
        "test.checkpointing", {"seconds_by_attempt": {"1": 60, "2": 0.2}}, lease_seconds=60
    )
    first = wait_for_attempt(job.pk, 1)
    assert wait_for_state(job.pk, "running").attempt == 1
    staying = start_qcluster(JOBS_SHUTDOWN_GRACE_SECONDS="1")
    wait_until(
        lambda: "embedded scheduler" in staying.log(),
        timeout=30,
        what="the second cluster to start",
        job_id=job.pk,
    )
    leaving_pids = descendants(leaving.proc.pid) | {leaving.proc.pid}
    assert worker_pid(first.worker) in leaving_pids

    os.kill(leaving.proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    # Stops claiming at once: a job enqueued now goes to the other cluster, although one of the
    # leaving cluster's two workers is idle.
    other = enqueue("test.echo")
    done = wait_for_state(other.pk, "succeeded", timeout=10)
    assert worker_pid(Attempt.objects.get(job=done).worker) not in leaving_pids

    released = wait_for_outcome(job.pk, 1, {"released"}, timeout=GRACE_SECONDS + 5)
    released_after = time.monotonic() - signalled
    assert released_after >= GRACE_SECONDS - 0.1, "handed back before the grace period ended"
    # The release is fenced and decided by the database; the next claim follows at once.
    second = wait_for_attempt(job.pk, 2, timeout=5)
    assert worker_pid(second.worker) not in leaving_pids
    assert (second.claimed_at - released.ended_at).total_seconds() < 2.0
    # The abandoned handler kept checkpointing: its next write was refused and recorded.
    stale = wait_for_rejection(job.pk, 1, {"checkpoint", "commit", "heartbeat"}, timeout=5)
    # (presented 1; current 1 if it came before the other cluster's claim, else 2: an idle
    # worker there claims within milliseconds of the release's NOTIFY)
    assert stale.attempt_presented == 1
    assert (stale.attempt_current, stale.state_current) in {
        (1, "queued"), (1, "running"), (2, "running"), (2, "succeeded"),
    }  # fmt: skip
    assert wait_for_state(job.pk, "succeeded", timeout=10).attempt == 2

    gone_after = released_after + wait_gone(leaving, SHUTDOWN_MARGIN_SECONDS + 5)
    assert gone_after < GRACE_SECONDS + 3.0, f"group took {gone_after:.1f} s to go"


def test_a_handler_that_ignores_everything_is_abandoned_when_the_grace_period_ends(
    start_qcluster,
):
    """A handler that never calls into the platform (a plain 60 s sleep) cannot be told: its job
    is handed back when the grace ends and its worker process exits."""
    cluster = start_qcluster(JOBS_SHUTDOWN_GRACE_SECONDS="1")
    job = enqueue("test.sleep", {"seconds": 60}, lease_seconds=60)
    wait_for_attempt(job.pk, 1)
    os.kill(cluster.proc.pid, signal.SIGTERM)
    took = wait_gone(cluster, 1 + SHUTDOWN_MARGIN_SECONDS + 5)
    assert took < 1 + 3.0, f"group took {took:.1f} s to go"
    assert Attempt.objects.get(job=job, number=1).outcome == "released"
    assert wait_for_state(job.pk, "queued").attempt == 1  # ready for any worker, now
    assert "abandoning the running handler" in cluster.log()


def test_sigterm_while_the_database_is_unreachable_stops_within_a_bound(pg_proxy, start_qcluster):
    """The database goes silent (a partition) while a job runs, then SIGTERM: the main process
    is no longer held by its query, and the whole group is gone within grace + margin."""
    cluster = start_qcluster(
        DATABASE_URL=subprocess_database_url(via_port=pg_proxy.port),
        JOBS_SHUTDOWN_GRACE_SECONDS="1",
        JOBS_DB_TIMEOUT_SECONDS="1",
        PG_CONNECT_TIMEOUT="2",
    )
    job = enqueue("test.sleep", {"seconds": 60}, lease_seconds=60)
    wait_for_attempt(job.pk, 1)
    pg_proxy.hold()
    wait_until(
        lambda: "database unreachable" in cluster.log(),
        timeout=15,
        what="the cluster to notice the outage",
        job_id=job.pk,
    )
    os.kill(cluster.proc.pid, signal.SIGTERM)
    took = wait_gone(cluster, 1 + SHUTDOWN_MARGIN_SECONDS + 4)
    assert took < 1 + SHUTDOWN_MARGIN_SECONDS + 2, f"group took {took:.1f} s to go"
