"""The read-only admin shows jobs with their attempts and rejected writes."""

import pytest

from jobs.models import RejectedWrite
from jobs.states import JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def zombie_job(make_job):
    job = make_job(state=JobState.RUNNING, attempt=2, worker="host-b:2", payload={"x": "<b>"})
    RejectedWrite.objects.create(
        job=job,
        attempt_presented=1,
        attempt_current=2,
        state_current="running",
        worker="host-a:1",
        write="commit",
    )
    return job


def test_the_job_list_shows_state_and_attempt(admin_client, zombie_job):
    page = admin_client.get("/admin/jobs/job/")
    assert page.status_code == 200
    assert b"test.echo" in page.content and b"running" in page.content.lower()


def test_a_job_page_shows_its_attempts_and_rejected_writes(admin_client, zombie_job):
    page = admin_client.get(f"/admin/jobs/job/{zombie_job.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "host-b:2" in body and "host-a:1" in body
    assert "<b>" not in body  # user-supplied payload is escaped


@pytest.mark.parametrize("url", ["/admin/jobs/job/add/", "/admin/jobs/attempt/add/"])
def test_jobs_cannot_be_added_or_edited_in_the_admin(admin_client, url):
    assert admin_client.get(url).status_code == 403


def test_editing_a_job_by_post_is_refused(admin_client, zombie_job):
    response = admin_client.post(f"/admin/jobs/job/{zombie_job.pk}/change/", {"state": "succeeded"})
    assert response.status_code == 403
    zombie_job.refresh_from_db()
    assert zombie_job.state == JobState.RUNNING


def test_the_admin_requires_login(client, zombie_job):
    assert client.get("/admin/jobs/job/").status_code == 302
