"""A worker process SIGKILLed in the middle of a job (the OOM killer, kill -9) does not leave
that job waiting out its whole lease: qcluster's main process sees the worker die and reclaims
the jobs it held at once (jobs.worker.rescue), charged and recorded like any reclaim.

Real qcluster, a 30 s lease: before the rescue, the job ran again 30-31 s after the kill (its
lease); with it, within a second -- and since a charged death is retried like a failure, after
the failure's backoff (JOBS_RETRY_BASE_SECONDS, 2 s for attempt 1, up to 25 % jitter)."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs import enqueue
from jobs.models import Attempt, JobEvent
from jobs.ops import metrics
from jobs.ops.lease_hint import lease_hints
from tests.acceptance.cluster import (
    wait_for_attempt,
    wait_for_state,
    wait_until,
    worker_pid,
)
from tests.conftest import database_now

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

LEASE_SECONDS = 30.0
BACKOFF_SECONDS = 2.0  # JOBS_RETRY_BASE_SECONDS's default: attempt 1's failure backoff
RERUN_WITHIN_SECONDS = BACKOFF_SECONDS * 1.25 + 3.0  # a look every 0.25 s, then a dispatch


def test_a_sigkilled_workers_job_runs_again_at_once_not_after_its_lease(start_qcluster):
    cluster = start_qcluster(JOBS_LEASE_SECONDS=str(LEASE_SECONDS))
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": 300, "2": 0}}, max_attempts=3)
    first = wait_for_attempt(job.pk, 1)
    wait_until(  # a heartbeat confirmed the handler running: the attempt is charged
        lambda: Attempt.objects.filter(
            job_id=job.pk, number=1, running_confirmed_at__isnull=False
        ).exists(),
        timeout=10,
        what="attempt 1's handler to be confirmed running",
        job_id=job.pk,
    )
    killed_at = database_now()
    cluster.kill(worker_pid(first.worker))

    second = wait_for_attempt(job.pk, 2, timeout=LEASE_SECONDS + 10)
    rerun = (second.claimed_at - killed_at).total_seconds()
    assert BACKOFF_SECONDS <= rerun < RERUN_WITHIN_SECONDS, f"attempt 2 {rerun:.2f} s after"
    print(f"attempt 2 began {rerun:.2f} s after the SIGKILL")
    assert worker_pid(second.worker) != worker_pid(first.worker)

    done = wait_for_state(job.pk, "succeeded")
    assert (done.attempt, done.attempts_released) == (2, 0)  # attempt 1 was charged
    first.refresh_from_db()
    assert first.outcome == "expired"
    (expired,) = JobEvent.objects.filter(job_id=job.pk, attempt=1, type="expired")
    assert expired.data["worker_exited"] is True and expired.data["charged"] is True
    assert expired.data["worker"] == first.worker
    assert f"worker exited, lease reclaimed: job={job.pk} " in cluster.log()


def test_a_rescue_in_the_figures_is_a_reclaim_not_a_malformed_event_nor_a_lease_too_short(
    start_qcluster, monkeypatch
):
    """/metrics and the lease hint read a real rescue's expired event (deadline after the next
    claim, a short silence): a reclaim, left out of the reclaim latency without being called
    malformed, and no evidence that the lease is too short."""
    cluster = start_qcluster(JOBS_LEASE_SECONDS=str(LEASE_SECONDS))
    job = enqueue("test.sleep", {"seconds_by_attempt": {"1": 300, "2": 0}}, max_attempts=3)
    first = wait_for_attempt(job.pk, 1)
    cluster.kill(worker_pid(first.worker))
    wait_for_state(job.pk, "succeeded", timeout=LEASE_SECONDS + 10)
    assert JobEvent.objects.get(job_id=job.pk, type="expired").data["worker_exited"] is True
    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)
    fresh = metrics.history.Incremental("jobs_jobevent", metrics.history.events)
    monkeypatch.setattr(metrics, "_event_tally", fresh)
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if not s.labels or s.name == "jobs_lease_too_short"
    }
    assert samples["jobs_reclaims_total"] == 1
    assert samples["jobs_metrics_malformed_events_total"] == 0
    assert samples["jobs_reclaim_latency_seconds_count"] == 0
    (hint,) = [h for h in lease_hints() if h.kind == "test.sleep"]
    assert (hint.rescued, hint.near_miss_expiries, hint.too_short) == (1, 0, False)
