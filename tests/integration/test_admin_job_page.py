"""The admin's job page: each field once, the action buttons with a confirmation in the fence's
words, and a job whose payload Python cannot decode shown as undecodable (never a 500)."""

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client

from jobs.core.states import JobState
from jobs.models import Job

pytestmark = pytest.mark.django_db

NESTED = "[" * 5000 + "]" * 5000  # valid jsonb, beyond Python's recursion limit


def _page(client: Client, job: Job) -> str:
    response = client.get(f"/admin/jobs/job/{job.pk}/change/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_job_page_shows_each_field_once(admin_client, make_job):
    job = make_job(state=JobState.RUNNING, attempt=2, queue="mail", payload={"n": 1})
    body = _page(admin_client, job)
    for name in ("kind", "queue", "priority", "state", "attempt", "unique_key", "error"):
        assert len(re.findall(rf'class="form-row[^"]*\bfield-{name}\b', body)) == 1, name
    assert "field-payload_shown" in body and 'class="form-row field-payload"' not in body
    assert "&quot;n&quot;: 1" in body  # the payload, formatted


def test_the_job_page_carries_the_action_buttons_for_those_who_may_act(admin_client, make_job):
    job = make_job(state=JobState.FAILED, attempt=1)
    body = _page(admin_client, job)
    for name in ("requeue", "cancel", "retry", "copy"):
        assert f'href="/admin/jobs/job/{job.pk}/act/{name}/"' in body
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    client = Client()
    client.force_login(viewer)
    assert "/act/requeue/" not in _page(client, job)
    assert client.get(f"/admin/jobs/job/{job.pk}/act/requeue/").status_code == 403
    assert client.post(f"/admin/jobs/job/{job.pk}/act/requeue/").status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.FAILED


def test_an_admin_button_confirms_with_the_fence_then_acts_audited(admin_client, make_job):
    job = make_job(state=JobState.RUNNING, attempt=3, worker="vm:1234")
    url = f"/admin/jobs/job/{job.pk}/act/cancel/"
    confirm = admin_client.get(url).content.decode()
    assert "attempt 3 is running on vm:1234; its later writes will be refused" in confirm
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    response = admin_client.post(url, follow=True)
    assert response.redirect_chain[-1][0] == f"/admin/jobs/job/{job.pk}/change/"
    assert "cancel: 1 changed, 0 skipped" in response.content.decode().lower()
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert "cancel (admin), fenced by attempt 3" in entry.change_message


def test_an_admin_button_needs_csrf(make_job):
    job = make_job(state=JobState.FAILED, attempt=1)
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    assert client.post(f"/admin/jobs/job/{job.pk}/act/retry/").status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.FAILED


def _undecodable_job() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_job (kind, payload, state, attempt, finished_at) "
            "VALUES ('test.echo', %s::jsonb, 'failed', 1, now()) RETURNING id",
            [NESTED],
        )
        return int(cur.fetchone()[0])


def test_a_payload_python_cannot_decode_is_shown_as_undecodable(admin_client):
    job_id = _undecodable_job()
    listing = admin_client.get("/admin/jobs/job/")
    assert listing.status_code == 200 and f">{job_id}<" in listing.content.decode()
    page = admin_client.get(f"/admin/jobs/job/{job_id}/change/")
    assert page.status_code == 200
    assert "undecodable: its payload cannot be decoded" in page.content.decode()
    assert admin_client.get(f"/admin/jobs/job/{job_id}/act/copy/").status_code == 200


def test_copying_a_payload_python_cannot_decode_is_refused_with_the_reason(admin_client):
    job_id = _undecodable_job()
    response = admin_client.post(f"/admin/jobs/job/{job_id}/act/copy/", follow=True)
    assert response.status_code == 200
    assert "refused: its payload cannot be decoded" in response.content.decode()
    listed = admin_client.post(
        "/admin/jobs/job/", {"action": "copy_jobs", "_selected_action": [job_id]}, follow=True
    )
    assert "copy: 0 changed, 1 skipped" in listed.content.decode().lower()
    assert Job.objects.count() == 1
    retried = admin_client.post(f"/admin/jobs/job/{job_id}/act/retry/", follow=True)
    assert "retry: 1 changed" in retried.content.decode().lower()  # other actions never read it


def test_the_dashboard_shows_an_undecodable_payload_and_refuses_its_copy(admin_client):
    job_id = _undecodable_job()  # a superuser may see the dashboard and act
    assert admin_client.get(f"/jobs/{job_id}/").status_code == 200
    assert admin_client.get("/jobs/").status_code == 200
    text = admin_client.post(f"/jobs/{job_id}/act/copy/", HTTP_HX_REQUEST="true").content.decode()
    assert "refused: its payload cannot be decoded" in text


def test_the_job_page_inlines_show_the_newest_rows_and_say_so(admin_client, make_job, monkeypatch):
    """Before: every attempt and rejected write was inlined (3,000 and 5,000: 14 MB in 36 s)."""
    from jobs.admin import job as job_admin
    from tests.dashboard.test_job_page_bounds import _many_attempts_and_rejections

    monkeypatch.setattr(job_admin, "INLINE_ROWS", 5)
    job = _many_attempts_and_rejections(make_job, 12)
    html = _page(admin_client, job)
    assert "the newest 5 of 12" in html.lower()
    assert "zombie:7<" not in html and "zombie:8<" in html
    assert html.count("w:7<") == 0 and html.count("w:8<") >= 1


@pytest.mark.parametrize("job_id", ["999999", str(2**63), "9" * 40])  # none, past bigint
@pytest.mark.parametrize("method", ["get", "post"])
def test_a_button_for_a_job_that_does_not_exist_says_so_without_a_confirmation(
    admin_client, job_id, method
):
    url = f"/admin/jobs/job/{job_id}/act/cancel/"
    response = getattr(admin_client, method)(url, follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == "/admin/jobs/job/"
    body = response.content.decode()
    assert f"No job {job_id}: nothing to cancel." in body
    assert "Cancel job" not in body  # no confirmation, no button
