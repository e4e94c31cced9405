"""A batch looks each known kind's handler and timeout up once (jobs.worker.runner._Kinds), but a
kind unknown when the batch starts is looked up again when its job is taken to run: an earlier
batch-mate's handler may register it (a handler module imported lazily). Until this test, the
batch's cached "unknown" failed such a job's attempt with "no handler is registered"."""

import pytest

from jobs.core import policy, registry, transitions
from jobs.core.conf import jobs_settings
from jobs.core.states import JobState
from jobs.models import Job
from jobs.worker import completer, runner
from jobs.worker.heartbeat import Heartbeater

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_kind_registered_by_an_earlier_batch_mate_runs_in_the_same_batch(monkeypatch):
    def late(ctx):
        return {"late": True}

    def importer(ctx):
        # What `import myapp.more_handlers` inside a handler does: registers another kind.
        monkeypatch.setitem(
            registry._handlers, "review.late", registry.Handler("review.late", late)
        )
        return {"imported": True}

    monkeypatch.setitem(
        registry._handlers, "review.importer", registry.Handler("review.importer", importer)
    )
    first = Job.objects.create(kind="review.importer", priority=10)
    second = Job.objects.create(kind="review.late", max_attempts=1)

    cfg = jobs_settings()
    with Heartbeater(policy.heartbeat_interval(cfg.LEASE_SECONDS, cfg), completer.commit) as beats:
        batch = transitions.claim(runner.worker_identity(), limit=2, lease_seconds=30)
        assert [c.fence.job_id for c in batch] == [first.pk, second.pk]
        assert runner.run_batch(batch, beats) == 2
        beats.flush()

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == JobState.SUCCEEDED
    assert (second.state, second.error) == (JobState.SUCCEEDED, ""), second.error
    assert second.result == {"late": True}
