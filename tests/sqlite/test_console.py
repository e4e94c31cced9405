"""What `bin/run`'s console says: one line per failure, retry, rejected (fenced) write and expiry,
nothing for a success -- read from a real `qcluster` on SQLite with bin/run's log levels."""

import re

import pytest

from jobs import enqueue
from jobs.models import RejectedWrite
from tests.acceptance.cluster import (
    QCluster,
    pause_first_attempt_until_reclaimed,
    wait_for_db_clock_past,
    wait_for_rejection,
    wait_for_state,
    wait_until,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def lines_about(cluster: QCluster, job_id: int) -> list[str]:
    about = re.compile(rf"\bjob[ =]{job_id}\b")
    return [line for line in cluster.log().splitlines() if about.search(line)]


def test_the_console_prints_one_line_per_failure_retry_rejection_and_expiry(start_qcluster):
    # bin/run's levels: jobs at INFO, django-q2 at WARNING (its per-task lines stay out).
    cluster = start_qcluster(Q_LOG_LEVEL="WARNING", JOBS_RETRY_BASE_SECONDS="0.1")
    ok = enqueue("test.echo", {"quiet": True})
    failing = enqueue("test.fail")  # its handler allows 2 attempts: a retry, then failed
    wait_for_state(ok.pk, "succeeded")
    wait_for_state(failing.pk, "failed")

    def failure_lines() -> list[str] | None:
        lines = lines_about(cluster, failing.pk)
        return lines if len(lines) >= 2 else None

    retry, final = wait_until(failure_lines, timeout=10, what="two lines", job_id=failing.pk)
    assert f"job {failing.pk} (test.fail) attempt 1 failed, retry in" in retry
    assert retry.endswith("RuntimeError: boom on attempt 1")
    assert f"job {failing.pk} (test.fail) attempt 2 failed for good (2 of 2 attempts)" in final
    assert final.endswith("RuntimeError: boom on attempt 2") and "WARNING" in final

    zombie = enqueue("test.sleep", {"seconds_by_attempt": {"1": 1.5, "2": 0.2}})
    reclaimed = pause_first_attempt_until_reclaimed(cluster, zombie.pk)
    wait_for_state(zombie.pk, "succeeded")
    wait_for_db_clock_past(zombie.pk, reclaimed.paused_at, 1.5)
    cluster.resume(reclaimed.zombie)
    wait_for_rejection(zombie.pk, 1, {"commit", "heartbeat"})  # whichever it presents first
    cluster.shutdown()  # every line written: the process group is gone

    lines = lines_about(cluster, zombie.pk)
    expired = [line for line in lines if "lease reclaimed" in line]
    rejected = [line for line in lines if "rejected" in line]
    assert len(expired) == 1, lines
    assert "attempt_presented=1 attempt_current=2" in rejected[0]
    # One line per rejected write the database recorded, and nothing else about this job.
    assert len(rejected) == RejectedWrite.objects.filter(job=zombie).count(), lines
    assert len(lines) == 1 + len(rejected), lines
    assert len(lines_about(cluster, failing.pk)) == 2
    assert lines_about(cluster, ok.pk) == []  # quiet for successes
