"""The job page shows every write path beyond the job row -- effects, staged outputs, intents --
escaped, and pushes them live when the relay performs an intent."""

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

import jobs
from dashboard import selectors
from jobs.effects import outbox
from jobs.models import IdempotencyKey, Intent, StagedOutput
from tests.dashboard.test_consumers import live, receive_until, stop_event_tail, swapped
from tests.integration.attempts import claim, expire_and_reap
from tests.receiver import receiver

__all__ = ["stop_event_tail"]  # the autouse fixture, for the websocket test below

HOSTILE = "<script>alert(1)</script>"


def _job_with_every_write(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    job = jobs.enqueue("test.echo")
    zombie = claim("host-a:1")
    zombie.ctx.stage("out.txt", "zombie")
    expire_and_reap(job.pk)
    current = claim("host-b:2")
    current.ctx.stage("out.txt", "kept")
    current.ctx.effect("notify", lambda key: {"said": HOSTILE})
    current.ctx.intent("publish", "webhook", {"url": "http://127.0.0.1:9/hook", "json": HOSTILE})
    current.commit(None)
    Intent.objects.update(last_error=HOSTILE)
    return job


@pytest.mark.django_db(transaction=True)
def test_the_job_page_shows_effects_outputs_and_intents_escaped(
    operator_client: Client, settings, tmp_path
) -> None:
    job = _job_with_every_write(settings, tmp_path)
    html = operator_client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    assert 'id="job-effects"' in html and f"{job.pk}:notify" in html
    assert 'id="job-outputs"' in html and f"jobs/{job.pk}/attempt-2/out.txt" in html
    assert "orphan (awaiting the janitor)" in html and "promoted" in html
    assert 'id="job-intents"' in html and f"{job.pk}:publish" in html and "pending" in html
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert StagedOutput.objects.filter(job=job).count() == 2
    assert IdempotencyKey.objects.get(job=job).attempt == 2


@pytest.mark.django_db(transaction=True)
def test_a_restages_spare_row_of_a_committed_attempt_is_shown_as_an_orphan_to_be(
    settings, tmp_path
) -> None:
    # A worker that died mid re-stage leaves a spare row naming a file that is no output: the
    # janitor will delete it, so the page never calls it promoted.
    settings.MEDIA_ROOT = str(tmp_path)
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.stage("out.txt", "kept")
    spare = StagedOutput.objects.create(
        job=job, attempt=1, name=StagedOutput.spare_name(), path=f"jobs/{job.pk}/attempt-1/x.txt"
    )
    running.commit(None)
    detail = selectors.job_detail(job.pk)
    assert detail is not None
    shown = {o.name: o.shown_status for o in detail.outputs}  # type: ignore[attr-defined]
    assert shown == {"out.txt": "promoted", spare.name: "orphan (awaiting the janitor)"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_performed_intent_reaches_an_open_job_page_live(staff: User, settings) -> None:
    with receiver() as r:
        job = await sync_to_async(jobs.enqueue)("test.echo")

        def commit_an_intent() -> None:
            running = claim("host-a:1")
            running.ctx.intent("publish", "webhook", {"url": f"{r.url}/hook", "json": {}})
            running.commit(None)

        await sync_to_async(commit_an_intent)()
        since = await sync_to_async(selectors.latest_event_id)()
        communicator = live(staff, f"page=job&job={job.pk}&since={since}")
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=5)  # hello
        assert await sync_to_async(outbox.relay_once)("relay-a") == 1
        message = await receive_until(
            communicator, lambda m: swapped("job-live")(m) and "performed" in str(m)
        )
        assert f"{job.pk}:publish" in message["swaps"][0]["html"]
        await communicator.disconnect()
