"""/metrics: names, values derived from the tables, incremental counting, protection."""

import logging
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs.core import transitions
from jobs.core.exceptions import LeaseLost
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.models import Job, JobEvent
from jobs.ops import history, metrics
from jobs.worker.bridge import drain

TOKEN = "s3cret-token"


def scrape(client) -> dict[str, float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


@pytest.fixture(autouse=True)
def token(settings):
    settings.JOBS_METRICS_TOKEN = TOKEN


@pytest.mark.django_db
def test_every_design_name_is_exported(client):
    names = {k.split("{")[0] for k in scrape(client)}
    for name in [
        "jobs_stale_writes_rejected_total",
        "jobs_claims_total",
        "jobs_reclaims_total",
        "jobs_succeeded_total",
        "jobs_failed_total",
        "jobs_effects_deduplicated_total",
        "jobs_orphaned_outputs",
        "jobs_running_expired_leases",
        "jobs_attempts_per_success_bucket",
        "jobs_wasted_work_seconds_total",
        "jobs_heartbeat_gap_seconds_bucket",
        "jobs_reclaim_latency_seconds_bucket",
        "jobs_enqueue_to_start_seconds_bucket",
    ]:
        assert name in names, name


@pytest.mark.django_db
def test_counters_follow_the_tables_across_scrapes(client, make_job, monkeypatch):
    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)  # every row settles at once
    job = make_job(kind="test.echo")
    (claimed,) = transitions.claim("w:1", lease_seconds=30)
    before = scrape(client)
    assert before["jobs_claims_total"] >= 1
    transitions.commit(claimed.fence, {"ok": 1})
    reclaimed = make_job(state=JobState.RUNNING, attempt=2)
    with pytest.raises(LeaseLost):
        transitions.commit(Fence(reclaimed.pk, 1, "zombie:2"), {"late": 1})
    after = scrape(client)
    assert after["jobs_succeeded_total"] == before["jobs_succeeded_total"] + 1
    assert after["jobs_stale_writes_rejected_total{write=commit}"] == 1
    assert after["jobs_attempts_per_success_bucket{le=1.0}"] == 1
    assert after["jobs_enqueue_to_start_seconds_count"] == 1
    assert job.pk
    # A fresh process (no tally) reads the same totals from scratch.
    monkeypatch.setattr(
        metrics, "_event_tally", history.Incremental("jobs_jobevent", history.events)
    )
    assert scrape(client)["jobs_succeeded_total"] == after["jobs_succeeded_total"]


@pytest.mark.django_db
def test_queue_depth_and_running_leases_are_live(client, make_job):
    make_job(queue="mail")
    make_job(queue="mail")
    make_job(state=JobState.RUNNING, attempt=1, lease_in=-5)
    samples = scrape(client)
    assert samples["jobs_queue_depth{queue=mail}"] == 2
    assert samples["jobs_queue_oldest_age_seconds{queue=mail}"] >= 0
    assert samples["jobs_running_expired_leases"] == 1


# Sequences reset: a fresh tally reads every id from 1, and when earlier tests of the session
# have used up more than MAX_PENDING event ids it would skip them all at once (not look for them).
@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_an_event_committed_late_is_still_counted(client, make_job, second_connection, monkeypatch):
    monkeypatch.setattr(
        metrics, "_event_tally", history.Incremental("jobs_jobevent", history.events)
    )
    job = make_job()
    second_connection.autocommit = False
    with second_connection.cursor() as cur:  # takes an id first, commits last
        cur.execute(
            "INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data) "
            "VALUES (%s, 1, 'succeeded', 'slow', clock_timestamp(), '{}')",
            [job.pk],
        )
    JobEvent.objects.create(job=job, attempt=1, type="succeeded", worker="fast")
    assert scrape(client)["jobs_succeeded_total"] == 1
    second_connection.commit()
    assert scrape(client)["jobs_succeeded_total"] == 2


@pytest.mark.django_db
def test_metrics_need_a_token_or_staff(client):
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    client.force_login(User.objects.create_user("outsider", password="pw"))
    assert client.get("/metrics").status_code == 401
    client.force_login(User.objects.create_user("staff", password="pw", is_staff=True))
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_an_extra_source_is_added_to_every_scrape(client, monkeypatch):
    monkeypatch.setattr(metrics, "_sources", [])
    metrics.register(lambda: [metrics.gauge_family("jobs_outbox", "doc", {"pending": 3}, "status")])
    assert scrape(client)["jobs_outbox{status=pending}"] == 3


@pytest.mark.django_db
def test_many_queues_are_capped_in_labels(client, make_job, monkeypatch):
    monkeypatch.setattr(metrics, "MAX_QUEUE_LABELS", 2)
    for q in ["a", "a", "a", "b", "b", "c", "d"]:
        make_job(queue=q)
    samples = scrape(client)
    assert samples["jobs_queue_depth{queue=a}"] == 3
    assert samples["jobs_queue_depth{queue=_other}"] == 2
    assert not any("queue=c" in k for k in samples)
    assert Job.objects.count() == 7


@pytest.mark.django_db
def test_configured_queues_keep_their_series_beside_more_queues_than_the_labels(
    client, make_job, settings, monkeypatch
):
    # operations.md: `default` and configured queues always. With more queues than
    # MAX_QUEUE_LABELS, an empty `default` and a configured queue with one job waiting were
    # summed into _other, so `jobs_queue_oldest_age_seconds{queue="critical"} > SLO` went quiet.
    monkeypatch.delenv("JOBS_QUEUES", raising=False)
    settings.JOBS = {**settings.JOBS, "QUEUES": "critical"}
    monkeypatch.setattr(metrics, "MAX_QUEUE_LABELS", 2)
    for q in ["a", "a", "a", "b", "b", "c", "c", "critical"]:
        make_job(queue=q, run_at=timezone.now() - timedelta(hours=1))
    samples = scrape(client)
    assert samples["jobs_queue_depth{queue=critical}"] == 1
    assert samples["jobs_queue_oldest_age_seconds{queue=critical}"] >= 3600
    assert samples["jobs_queue_depth{queue=default}"] == 0
    assert samples["jobs_queue_depth{queue=a}"] == 3
    assert samples["jobs_queue_depth{queue=b}"] == 2
    assert samples["jobs_queue_depth{queue=_other}"] == 2  # c: the others beyond the two kept


@pytest.mark.django_db
def test_an_empty_default_queue_is_reported_at_zero(client):
    assert scrape(client)["jobs_queue_depth{queue=default}"] == 0


@pytest.mark.django_db
def test_every_configured_queue_is_reported_at_zero_when_empty(client, settings, monkeypatch):
    # operations.md: `default` and every configured queue are always exported, 0 when empty.
    monkeypatch.delenv("JOBS_QUEUES", raising=False)  # the environment would override JOBS
    settings.JOBS = {**settings.JOBS, "QUEUES": "a,b"}  # read as JOBS_QUEUES would be
    assert not Job.objects.exists()
    samples = scrape(client)
    for queue in ["default", "a", "b"]:
        assert samples[f"jobs_queue_depth{{queue={queue}}}"] == 0, queue
        assert samples[f"jobs_queue_oldest_age_seconds{{queue={queue}}}"] == 0, queue


@pytest.mark.django_db
def test_the_outbox_figures_come_from_the_intent_rows(client, make_job):
    from jobs.models import Intent

    job = make_job(kind="test.echo")
    common = {"job": job, "attempt": 1, "target": "webhook", "data": {}}
    Intent.objects.create(step="a", key=f"{job.pk}:a", state="pending", **common)
    Intent.objects.create(step="b", key=f"{job.pk}:b", state="performing", performs=3, **common)
    Intent.objects.create(step="c", key=f"{job.pk}:c", state="done", reconciled=True, **common)
    Intent.objects.create(step="d", key=f"{job.pk}:d", state="failed", performs=1, **common)
    got = scrape(client)
    assert got["jobs_outbox_pending_intents"] == 2
    assert got["jobs_outbox_oldest_pending_age_seconds"] >= 0
    assert got["jobs_outbox_relay_reperforms_total"] == 2
    assert got["jobs_outbox_reconciliation_mismatches_total"] == 1
    assert got["jobs_outbox_failed_intents"] == 1


@pytest.mark.django_db
def test_kinds_planted_by_raw_rows_are_capped_in_labels(client, monkeypatch):
    # A kind is whatever a row holds: each planted kind is claimed and failed once, and each
    # was one jobs_lease_too_short series (up to the 10,000 attempts the hint reads).
    monkeypatch.setattr(metrics, "MAX_KIND_LABELS", 3, raising=False)
    Job.objects.bulk_create([Job(kind=f"planted.k{i}", max_attempts=1) for i in range(8)])
    deadline = time.monotonic() + 60
    while Job.objects.filter(state=JobState.QUEUED).exists():
        assert time.monotonic() < deadline, "the planted jobs were not failed in time"
        drain()
    assert Job.objects.filter(state=JobState.FAILED).count() == 8
    kinds = [k for k in scrape(client) if k.startswith("jobs_lease_too_short{")]
    assert sorted(kinds) == [
        "jobs_lease_too_short{kind=_other}",
        "jobs_lease_too_short{kind=planted.k0}",
        "jobs_lease_too_short{kind=planted.k1}",
        "jobs_lease_too_short{kind=planted.k2}",
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "data",
    [
        {"lease_expires_at": "garbage"},
        {"lease_expires_at": "2026-02-30T10:00:00+00:00"},  # no such day
        {"lease_expires_at": "infinity"},
        {"lease_expires_at": 12345},
        {"lease_expires_at": ["2026-01-01T00:00:00+00:00"]},
        {"charged": True},  # no deadline at all
        ["not", "an", "object"],
        {"lease_expires_at": "2999-01-01T00:00:00+00:00"},  # after the claim that followed it
    ],
)
def test_a_malformed_expired_event_is_skipped_and_counted_alone(
    client, make_job, monkeypatch, caplog, data
):
    # One hand-inserted `expired` event whose deadline cannot be read used to fail the reclaim
    # histogram's statement, and with it every scrape; it is left out, logged and counted.
    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)
    monkeypatch.setattr(
        metrics, "_event_tally", history.Incremental("jobs_jobevent", history.events)
    )
    good, bad = make_job(attempt=2), make_job(attempt=2)
    past = timezone.now() - timedelta(seconds=3)
    for job, evidence in ((good, {"lease_expires_at": past.isoformat()}), (bad, data)):
        expired = JobEvent.objects.create(
            job=job, attempt=1, type="expired", worker="r", data=evidence
        )
        JobEvent.objects.create(job=job, attempt=2, type="claimed", worker="w")
    with caplog.at_level(logging.WARNING, logger="jobs.metrics"):
        samples = scrape(client)
    assert f"jobs_jobevent ids {expired.pk}" in caplog.text  # the bad one, planted last
    assert samples["jobs_reclaims_total"] == 2
    assert samples["jobs_reclaim_latency_seconds_count"] == 1
    assert 2 < samples["jobs_reclaim_latency_seconds_sum"] < 60
    assert samples["jobs_metrics_malformed_events_total"] == 1
    assert samples["jobs_claims_total"] == 2  # everything else is still scraped


@pytest.mark.django_db
def test_after_a_prune_a_running_process_and_a_new_one_count_differently(
    client, make_job, monkeypatch
):
    # docs/operations.md said every number is the same from any web process but for events
    # committed late. A prune that leaves newer events behind is a second exception: a process
    # that counted the pruned events keeps them, one started after the prune never sees them.
    from django.db import connection

    from jobs.ops import retention

    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)
    running = history.Incremental("jobs_jobevent", history.events)
    monkeypatch.setattr(metrics, "_event_tally", running)
    old, recent = make_job(state=JobState.SUCCEEDED), make_job(state=JobState.SUCCEEDED)
    for job in (old, recent):
        JobEvent.objects.create(job=job, attempt=1, type="succeeded", worker="w")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET finished_at = clock_timestamp() - interval '10 days', "
            "updated_at = clock_timestamp() - interval '10 days' WHERE id = %s",
            [old.pk],
        )
    assert scrape(client)["jobs_succeeded_total"] == 2
    assert retention.prune(7).jobs == 1

    assert scrape(client)["jobs_succeeded_total"] == 2  # the running process: no reset
    monkeypatch.setattr(
        metrics, "_event_tally", history.Incremental("jobs_jobevent", history.events)
    )
    assert scrape(client)["jobs_succeeded_total"] == 1  # a process started after the prune
