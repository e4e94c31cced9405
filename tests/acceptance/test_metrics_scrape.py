"""/metrics scraped in this (web) process after real qcluster workers did the work, parsed with
prometheus_client's own parser: the numbers come from the tables, not from process memory."""

import os
from pathlib import Path

import pytest
from django.db.models import F
from prometheus_client.parser import text_string_to_metric_families

import jobs
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from tests.acceptance.cluster import (
    PROJECT_DIR,
    pause_first_attempt_until_reclaimed,
    wait_for_rejection,
    wait_for_state,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", PROJECT_DIR / "var" / "test-artifacts"))


def scrape(client) -> dict[str, float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken")
    assert response.status_code == 200
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # docs/operations.md's sample comes from here
    (ARTIFACTS / "metrics-after-zombie.txt").write_bytes(response.content)
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


@pytest.fixture(autouse=True)
def fresh_tallies(monkeypatch):
    """This process's tallies start empty: a test before this one (tests/ops/test_metrics.py)
    scraped rows inside its own transaction that were then rolled back, and a tally kept
    counting them (in production a scrape only ever reads committed rows)."""
    from jobs.ops import history, metrics

    monkeypatch.setattr(
        metrics, "_event_tally", history.Incremental("jobs_jobevent", history.events)
    )
    monkeypatch.setattr(
        metrics, "_rejection_tally", history.Incremental("jobs_rejectedwrite", history.rejections)
    )


def test_metrics_after_a_zombie_run_in_worker_processes(start_qcluster, client, settings):
    settings.JOBS_METRICS_TOKEN = "t0ken"
    cluster = start_qcluster()
    zombie_job = jobs.enqueue("test.sleep", {"seconds_by_attempt": {"1": 1.0, "2": 0}})
    reclaimed = pause_first_attempt_until_reclaimed(cluster, zombie_job.pk)
    quick = [jobs.enqueue("test.echo", {"n": i}) for i in range(20)]
    wait_for_state(zombie_job.pk, "succeeded")
    cluster.resume(reclaimed.zombie)
    wait_for_rejection(zombie_job.pk, 1, {"commit"})
    for job in quick:
        wait_for_state(job.pk, "succeeded")

    samples = scrape(client)
    # 22 claims at least; a resumed zombie's drain may claim (and hand back) one more.
    assert samples["jobs_claims_total"] == Attempt.objects.count() >= 22
    assert samples["jobs_succeeded_total"] == 21
    assert samples["jobs_reclaims_total"] == 1
    assert samples["jobs_stale_writes_rejected_total{write=commit}"] == 1
    assert (
        samples["jobs_stale_writes_rejected_total{write=commit}"]
        == RejectedWrite.objects.filter(write="commit").count()
    )
    succeeded = Job.objects.filter(state="succeeded")
    assert (
        samples["jobs_attempts_per_success_bucket{le=1.0}"] == succeeded.filter(attempt=1).count()
    )
    assert samples["jobs_attempts_per_success_bucket{le=2.0}"] == 21
    # The zombie ran from its claim to its rejected commit: at least the reclaim's lease.
    assert samples["jobs_wasted_work_seconds_total"] >= 2.0
    assert samples["jobs_reclaim_latency_seconds_count"] == 1
    assert 0 <= samples["jobs_reclaim_latency_seconds_sum"] < 10
    # First claims of jobs whose run_at is not past them: every quick job; the reclaimed one only
    # if its reclaim was uncharged (its handler never confirmed running: it kept its run_at, its
    # place), not if it was charged (due again at the reclaim: it no longer knows when it was due).
    zombie_job.refresh_from_db()
    kept_place = zombie_job.attempts_released == 1
    first_claims = JobEvent.objects.filter(type="claimed", attempt=1, job__run_at__lte=F("at"))
    assert first_claims.filter(job=zombie_job).exists() == kept_place
    assert samples["jobs_enqueue_to_start_seconds_count"] == first_claims.count()
    assert first_claims.count() >= succeeded.filter(attempt=1).count() + kept_place
    # The expired attempt's silence (>= the 2 s lease) is its longest heartbeat gap.
    assert samples["jobs_heartbeat_gap_seconds_count"] >= 1
    assert (
        samples["jobs_heartbeat_gap_seconds_bucket{le=1.0}"]
        < samples["jobs_heartbeat_gap_seconds_count"]
    )
    assert not any(k.startswith("jobs_queue_depth") and v for k, v in samples.items())
    assert samples["jobs_running_expired_leases"] == 0
    assert JobEvent.objects.filter(type="expired").count() == 1
