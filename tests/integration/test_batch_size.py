"""The claim batch follows the handlers' real run times: jobs handed back unstarted (waiting
behind a slow batch-mate) took no time and do not make a batch look quick.

Before, the drain divided a batch's time by every job claimed, so a batch of eight behind 0.2 s
handlers (one ran, seven handed back) looked like 25 ms jobs and the batch stayed at eight: each
batch ran one job and released seven, and attempt numbers climbed with every release.
"""

import time

import pytest
from django.test import override_settings

from jobs.core import transitions
from jobs.models import Job
from jobs.worker import runner

pytestmark = pytest.mark.django_db(transaction=True)
SLOW = 0.2


@override_settings(JOBS={"POLL_SECONDS": 0.1, "IDLE_WAIT_SECONDS": 0.0, "CLAIM_BATCH": 8})
def test_after_a_batch_of_slow_handlers_the_drain_claims_one_job_at_a_time(monkeypatch):
    # Seven quick jobs first (priority 1) grow the batch to 8 (claims of 1, 2 and 4), so the
    # fourth claim takes eight slow jobs at once.
    for i in range(7):
        Job.objects.create(kind="test.echo", payload={"n": i}, priority=1)
    slow = [Job.objects.create(kind="test.script", payload={"seconds": SLOW}) for _ in range(10)]
    claims: list[tuple[int, int]] = []  # (limit asked, jobs claimed)
    real_claim = transitions.claim

    def spy(worker, *, limit, **kw):  # type: ignore[no-untyped-def]
        batch = real_claim(worker, limit=limit, **kw)
        claims.append((limit, len(batch)))
        return batch

    monkeypatch.setattr(transitions, "claim", spy)
    assert runner.drain(budget_seconds=60.0) == 17
    assert claims[:4] == [(1, 1), (2, 2), (4, 4), (8, 8)]
    # The slow batch ran one handler and handed seven back: the next claims take one job each.
    assert {limit for limit, _ in claims[4:]} == {1}, claims
    for job in slow:
        job.refresh_from_db()
        assert job.state == "succeeded"
        assert job.attempt - job.attempts_released == 1  # each ran once
        assert job.attempt <= 2  # handed back at most once, by the one slow batch


def _claims_of_a_drain(monkeypatch, jobs: list[Job], claim_delay: float) -> list[tuple[int, int]]:
    """Drain `jobs`, each claim `claim_delay` slower than it is (as a claim walking a long dead
    index head under a stream); return (limit asked, jobs claimed) per claim."""
    Job.objects.bulk_create(jobs)
    claims: list[tuple[int, int]] = []
    real_claim = transitions.claim

    def slow_claim(worker, *, limit, **kw):  # type: ignore[no-untyped-def]
        batch = real_claim(worker, limit=limit, **kw)
        time.sleep(claim_delay)
        claims.append((limit, len(batch)))
        return batch

    monkeypatch.setattr(transitions, "claim", slow_claim)
    assert runner.drain(budget_seconds=60.0) == len(jobs)
    return claims


@override_settings(JOBS={"POLL_SECONDS": 0.1, "IDLE_WAIT_SECONDS": 0.0, "CLAIM_BATCH": 64})
def test_past_eight_the_batch_grows_where_the_claim_costs_more_than_its_quick_jobs(monkeypatch):
    # A claim of 0.1 s for jobs of about a millisecond or less: the claim is what costs, so the
    # drain asks for more than eight jobs per claim (up to 64 where the jobs are quick enough
    # that 64 of them run within 50 ms).
    jobs = [Job(kind="test.echo", payload={"n": i}) for i in range(300)]
    claims = _claims_of_a_drain(monkeypatch, jobs, claim_delay=0.1)
    limits = [limit for limit, _ in claims]
    assert limits[:4] == [1, 2, 4, 8]
    assert max(limits) > 8, claims


@override_settings(JOBS={"POLL_SECONDS": 0.1, "IDLE_WAIT_SECONDS": 0.0, "CLAIM_BATCH": 64})
def test_jobs_of_20_ms_batch_no_more_than_eight_however_dear_the_claim(monkeypatch):
    # Eight such jobs already take longer than 50 ms: past eight the batch would hold jobs
    # behind each other for longer than a quick batch may.
    jobs = [Job(kind="test.script", payload={"seconds": 0.02}) for _ in range(40)]
    claims = _claims_of_a_drain(monkeypatch, jobs, claim_delay=0.1)
    assert max(limit for limit, _ in claims) == 8, claims
