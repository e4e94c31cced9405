"""The claim batch follows the handlers' real run times: jobs handed back unstarted (waiting
behind a slow batch-mate) took no time and do not make a batch look quick.

Before, the drain divided a batch's time by every job claimed, so a batch of eight behind 0.2 s
handlers (one ran, seven handed back) looked like 25 ms jobs and the batch stayed at eight: each
batch ran one job and released seven, and attempt numbers climbed with every release.
"""

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
