"""A job whose JSON Python cannot decode (raw SQL: nested past its limit, or a number of more
than 4,300 digits) takes down no screen that lists rows *about* it: the rejected-writes feed and
the admin's attempts, rejected writes, events, effects, outputs, intents and schedules show its
rows like any other (its own page already did: tests/integration/test_admin_job_page.py)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs.models import (
    Attempt,
    IdempotencyKey,
    Intent,
    Job,
    JobEvent,
    RejectedWrite,
    Schedule,
    StagedOutput,
)

NESTED = "[" * 5000 + "]" * 5000  # valid jsonb, beyond Python's recursion limit
HUGE = '{"n": 1e5000}'  # jsonb keeps every digit; Python refuses an int of over 4,300


@pytest.fixture(params=[NESTED, HUGE], ids=["nested", "huge-number"])
def undecodable(request, make_job) -> Job:
    job = make_job(state="running", attempt=1, worker="host:7")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET payload = %s::jsonb, progress = %s::jsonb, result = %s::jsonb "
            "WHERE id = %s",
            [request.param] * 3 + [job.pk],
        )
    JobEvent.objects.create(job=job, attempt=1, type="claimed", worker="host:7")
    RejectedWrite.objects.create(
        job=job,
        attempt_presented=1,
        attempt_current=2,
        state_current="running",
        worker="host:7",
        write="commit",
    )
    IdempotencyKey.objects.create(key=f"{job.pk}:mail", job=job, step="mail", attempt=1)
    StagedOutput.objects.create(job=job, attempt=1, name="out", path=f"staged/{job.pk}/out")
    Intent.objects.create(job=job, attempt=1, step="hook", key=f"{job.pk}:hook", target="t")
    Schedule.objects.create(
        name="nightly",
        kind="test.echo",
        cron="0 3 * * *",
        next_at=timezone.now() + timedelta(hours=1),
        last_job=job,
    )
    return job


def test_the_rejected_feed_shows_a_rejected_write_of_an_undecodable_job(
    staff_client: Client, undecodable: Job
):
    response = staff_client.get("/rejected/")
    assert response.status_code == 200
    assert f"/jobs/{undecodable.pk}/" in response.content.decode()


@pytest.mark.parametrize(
    "model", [Attempt, RejectedWrite, JobEvent, IdempotencyKey, StagedOutput, Intent, Schedule]
)
def test_the_admin_lists_and_shows_rows_about_an_undecodable_job(
    admin_client: Client, undecodable: Job, model
):
    name = model._meta.model_name
    listed = admin_client.get(f"/admin/jobs/{name}/")
    assert listed.status_code == 200, name
    row = model.objects.get()
    shown = admin_client.get(f"/admin/jobs/{name}/{row.pk}/change/")
    assert shown.status_code == 200, name
    assert f"/admin/jobs/job/{undecodable.pk}/change/" in shown.content.decode()


@pytest.mark.parametrize("data", [NESTED, HUGE], ids=["nested", "huge-number"])
def test_a_records_own_json_python_cannot_decode_is_shown_as_its_text(admin_client, make_job, data):
    """Before: an event, intent, effect or schedule whose own JSON Python cannot decode made
    its admin list and its page a 500 (their job's JSON was already never read)."""
    job = make_job(state="running", attempt=1)
    rows = {
        "jobevent": (JobEvent.objects.create(job=job, attempt=1, type="claimed"), "data"),
        "intent": (
            Intent.objects.create(job=job, attempt=1, step="h", key=f"{job.pk}:h", target="t"),
            "data",
        ),
        "idempotencykey": (
            IdempotencyKey.objects.create(key=f"{job.pk}:m", job=job, step="m", attempt=1),
            "result",
        ),
    }
    for model, (row, column) in rows.items():
        with connection.cursor() as cur:
            cur.execute(
                f"UPDATE jobs_{model} SET {column} = %s::jsonb WHERE id = %s", [data, row.pk]
            )
        listing = admin_client.get(f"/admin/jobs/{model}/")
        assert listing.status_code == 200, model
        page = admin_client.get(f"/admin/jobs/{model}/{row.pk}/change/")
        assert page.status_code == 200, model
        assert '<pre class="json">' in page.content.decode(), model
