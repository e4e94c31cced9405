"""docs/effects.md, "Where operators look": which changes of an effect, output or intent write
an event (and so reach the job page live), and which write none (shown at the page's next
render): an intent's refused try is handed back without one, its performed try writes one; an
output discarded by its worker writes none."""

import pytest

import jobs
from jobs.effects import outbox
from jobs.models import Intent, JobEvent, StagedOutput
from tests.integration.attempts import claim
from tests.receiver import receiver

pytestmark = pytest.mark.django_db(transaction=True)


def _events(job_id: int) -> list[str]:
    return list(
        JobEvent.objects.filter(job_id=job_id).order_by("id").values_list("type", flat=True)
    )


def test_an_intents_refused_try_writes_no_event_its_performed_try_does():
    with receiver() as r:
        job = jobs.enqueue("test.echo")
        running = claim("host-a:1")
        running.ctx.intent("publish", "webhook", {"url": f"{r.url}/hook", "json": {}})
        running.commit(None)
        before = _events(job.pk)

        r.failing = True  # 503: refused, handed back to wait for its next try
        assert outbox.relay_once("relay-a") == 1
        row = Intent.objects.get()
        assert (row.state, row.failures) == ("pending", 1) and "503" in row.last_error
        assert _events(job.pk) == before  # no event: the page shows it at its next render

        r.failing = False
        Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")
        assert outbox.relay_once("relay-a") == 1
        assert _events(job.pk) == [*before, "intent_performed"]


def test_an_output_discarded_by_its_worker_writes_no_event():
    job = jobs.enqueue("test.echo", max_attempts=1)
    running = claim("host-a:1")
    running.ctx.stage("out.txt", b"x")
    running.fail("the handler failed after staging")
    assert StagedOutput.objects.get().status == "discarded"
    assert _events(job.pk) == ["enqueued", "claimed", "failed"]  # the job's own, none of its own
