"""A rescue (jobs.worker.rescue: the jobs of a worker process seen dead, reclaimed at once,
before their lease ran out) in the figures: /metrics counts it as a reclaim without calling its
event malformed, and the lease hint does not take it as evidence of a lease too short."""

import logging
import time
from datetime import timedelta

import pytest
from django.db.models import F
from prometheus_client.parser import text_string_to_metric_families

from jobs.core.states import JobState
from jobs.models import Attempt, JobEvent, RejectedWrite
from jobs.ops import history, metrics
from jobs.ops.lease_hint import lease_hints
from jobs.worker import reaper

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-token"
DEAD = "host-a:4242"


def _scrape(client) -> tuple[dict[str, float], dict[str, str]]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    samples, helps = {}, {}
    for family in text_string_to_metric_families(response.content.decode()):
        helps[family.name] = family.documentation
        for s in family.samples:
            samples[s.name] = s.value
    return samples, helps


def _rescued(make_job, n: int, kind: str = "test.sleep") -> list[int]:
    """`n` running jobs of the dead worker, rescued (lease still 30 s ahead), each then claimed
    again by attempt 2, as the next worker would."""
    planted = [
        make_job(kind=kind, state=JobState.RUNNING, attempt=1, worker=DEAD) for _ in range(n)
    ]
    # Claimed a second before the process is seen dead: a rescue takes what was claimed before
    # then, and SQLite's clock reads whole milliseconds -- a job planted in the millisecond of
    # the rescue could read as claimed after it.
    Attempt.objects.filter(job__in=planted).update(
        heartbeat_gap_max=1.0, claimed_at=F("claimed_at") - timedelta(seconds=1)
    )
    assert reaper.rescue(DEAD, time.monotonic(), "rescue:1") == n
    for job in planted:
        JobEvent.objects.create(job=job, attempt=2, type="claimed", worker="w:2")
    return [job.pk for job in planted]


def test_a_rescued_jobs_next_claim_is_not_a_malformed_event(
    client, settings, make_job, monkeypatch, caplog
):
    settings.JOBS_METRICS_TOKEN = TOKEN
    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(
        metrics, "_event_tally", history.Incremental("jobs_jobevent", history.events)
    )
    _rescued(make_job, 2)
    with caplog.at_level(logging.WARNING, logger="jobs.metrics"):
        samples, helps = _scrape(client)
    assert samples["jobs_reclaims_total"] == 2
    assert samples["jobs_metrics_malformed_events_total"] == 0
    assert "left out of jobs_reclaim_latency_seconds" not in caplog.text
    assert "rescue" in helps["jobs_reclaims"]  # a reclaim may be a dead worker's rescue


def test_the_heartbeat_gap_help_says_how_a_rescued_attempt_is_counted(
    client, settings, make_job, monkeypatch
):
    """A rescued attempt ends `expired` with its silence up to the rescue as its longest gap: one
    sample of jobs_heartbeat_gap_seconds, like any reclaimed attempt. The help said only
    "between accepted beats"; it now says what a reclaim and a rescue contribute."""
    settings.JOBS_METRICS_TOKEN = TOKEN
    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(
        metrics, "_event_tally", history.Incremental("jobs_jobevent", history.events)
    )
    _rescued(make_job, 2)
    samples, helps = _scrape(client)
    assert samples["jobs_heartbeat_gap_seconds_count"] == 2  # one sample per rescued attempt
    gap_help = helps["jobs_heartbeat_gap_seconds"]
    assert "rescue" in gap_help and "worker_exited" in gap_help, gap_help


def test_rescues_are_no_evidence_that_the_lease_is_too_short(make_job):
    ids = _rescued(make_job, 5)
    for job_id in ids:  # commits rejected for some other reason: the rule's second half
        RejectedWrite.objects.create(
            job_id=job_id, attempt_presented=1, attempt_current=2, worker="w:9", write="commit"
        )
    (hint,) = lease_hints()
    assert not hint.too_short, hint.advice
    assert hint.near_miss_expiries == 0
    assert "process died" in hint.advice
