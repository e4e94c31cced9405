"""The admin: view-only job pages, fenced actions, the validated add form, permissions."""

import re

import pytest
from django.contrib.auth.models import Permission, User

from jobs.core.states import JobState
from jobs.models import Job, JobEvent, RejectedWrite

pytestmark = pytest.mark.django_db

SECONDS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}")


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


def _staff(name, *codenames):
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


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


def test_times_are_shown_to_the_millisecond_and_the_effective_cap_is_named(admin_client, make_job):
    job = make_job(kind="test.fail", state=JobState.RUNNING, attempt=1)  # handler: 2 attempts
    body = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert SECONDS.search(body), "times must show seconds"
    assert "2 (handler)" in body
    assert "30 s (setting)" in body  # lease: neither the job nor test.fail sets one
    listing = admin_client.get("/admin/jobs/job/").content.decode()
    assert "2 (handler)" in listing and SECONDS.search(listing)
    from datetime import timedelta

    from django.db.models import F

    from jobs.models import Attempt

    Attempt.objects.filter(job=job).update(ended_at=F("claimed_at") + timedelta(seconds=1.25))
    assert "1.250 s" in admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    own = make_job(max_attempts=7)
    assert "7 (job)" in admin_client.get(f"/admin/jobs/job/{own.pk}/change/").content.decode()


def test_editing_a_job_by_post_is_refused(admin_client, zombie_job):
    response = admin_client.post(f"/admin/jobs/job/{zombie_job.pk}/change/", {"state": "succeeded"})
    assert response.status_code == 403
    zombie_job.refresh_from_db()
    assert zombie_job.state == JobState.RUNNING


def test_attempts_cannot_be_added_in_the_admin(admin_client):
    assert admin_client.get("/admin/jobs/attempt/add/").status_code == 403


def test_the_admin_requires_login(client, zombie_job):
    assert client.get("/admin/jobs/job/").status_code == 302


def test_the_requeue_action_takes_a_running_job_back_and_reports(admin_client, zombie_job):
    response = admin_client.post(
        "/admin/jobs/job/",
        {"action": "requeue_jobs", "_selected_action": [zombie_job.pk]},
        follow=True,
    )
    assert "requeue: 1 changed, 0 skipped" in response.content.decode().lower()
    zombie_job.refresh_from_db()
    assert (zombie_job.state, zombie_job.attempt) == ("queued", 2)


def test_an_action_on_all_matching_the_filter_reports_skips(admin_client, make_job):
    failed = [make_job(state=JobState.FAILED, attempt=1) for _ in range(3)]
    other = make_job(state=JobState.SUCCEEDED, attempt=1)
    response = admin_client.post(
        "/admin/jobs/job/?state__exact=failed",
        {"action": "cancel_jobs", "_selected_action": [failed[0].pk], "select_across": "1"},
        follow=True,
    )
    assert "cancel: 0 changed, 3 skipped (3 already failed)" in response.content.decode().lower()
    response = admin_client.post(
        "/admin/jobs/job/?state__exact=failed",
        {"action": "retry_jobs", "_selected_action": [failed[0].pk], "select_across": "1"},
        follow=True,
    )
    assert "retry: 3 changed" in response.content.decode().lower()
    assert Job.objects.filter(state="queued").count() == 3
    other.refresh_from_db()
    assert other.state == "succeeded"


def test_a_staff_user_without_the_change_permission_sees_no_action(client, make_job):
    job = make_job(state=JobState.FAILED, attempt=1)
    client.force_login(_staff("viewer", "view_job"))
    page = client.get("/admin/jobs/job/")
    assert page.status_code == 200 and b"retry_jobs" not in page.content
    client.post("/admin/jobs/job/", {"action": "retry_jobs", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.state == "failed"


def test_a_staff_user_with_the_change_permission_can_act(client, make_job):
    job = make_job(state=JobState.FAILED, attempt=1)
    client.force_login(_staff("operator", "view_job", "change_job"))
    assert b"retry_jobs" in client.get("/admin/jobs/job/").content
    client.post("/admin/jobs/job/", {"action": "retry_jobs", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.state == "queued"


def test_a_non_staff_user_cannot_reach_the_admin(client, make_job):
    job = make_job(state=JobState.FAILED, attempt=1)
    user = User.objects.create_user("outsider", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="change_job"))
    client.force_login(user)
    assert client.get("/admin/jobs/job/").status_code == 302
    client.post("/admin/jobs/job/", {"action": "retry_jobs", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.state == "failed"


def test_the_add_form_enqueues_through_jobs_enqueue(admin_client):
    response = admin_client.post(
        "/admin/jobs/job/add/",
        {"kind": "test.echo", "payload": '{"n": 1}', "queue": "default", "priority": "3"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.get()
    assert (job.kind, job.payload, job.priority, job.state) == ("test.echo", {"n": 1}, 3, "queued")
    assert JobEvent.objects.filter(job=job, type="enqueued").exists()


@pytest.mark.parametrize(
    "fields, error",
    [
        ({"kind": "no.such"}, "Select a valid choice"),
        ({"payload": "{not json"}, "not JSON"),
        ({"payload": "[" * 5000 + "]" * 5000}, "not JSON"),
        ({"payload": '{"a": "\\u0000"}'}, "NUL"),
        ({"queue": "bad queue!"}, "queue"),
        ({"max_attempts": "0"}, "max_attempts"),
    ],
)
def test_the_add_form_refuses_what_enqueue_refuses(admin_client, fields, error):
    data = {"kind": "test.echo", "payload": "{}", "queue": "default", "priority": "0", **fields}
    response = admin_client.post("/admin/jobs/job/add/", data)
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not Job.objects.exists()


@pytest.mark.parametrize("model", ["schedule", "ormq"])
def test_django_q2_admin_creates_no_work(admin_client, model):
    assert admin_client.get(f"/admin/django_q/{model}/add/").status_code == 403
    index = admin_client.get("/admin/").content.decode()
    assert "Transport (django-q2)" in index


def test_kind_and_queue_filters_come_without_scanning_every_job(admin_client, make_job):
    make_job(kind="test.echo", queue="mail")
    make_job(kind="test.sleep", queue="default", state=JobState.SUCCEEDED, attempt=1)
    page = admin_client.get("/admin/jobs/job/").content.decode()
    assert "?kind=test.fail" in page  # every registered kind, with or without jobs
    assert "?queue=mail" in page
    filtered = admin_client.get("/admin/jobs/job/?kind=test.echo&queue=mail").content.decode()
    assert "test.echo" in filtered and "test.sleep</td>" not in filtered


def test_django_q2_failures_cannot_be_resubmitted(admin_client):
    page = admin_client.get("/admin/django_q/failure/")
    assert page.status_code == 200 and b"resubmit" not in page.content.lower()


@pytest.mark.parametrize(
    "model", ["schedule", "idempotencykey", "jobevent", "rejectedwrite", "stagedoutput", "intent"]
)
def test_operations_tables_are_listed_read_only(admin_client, model):
    assert admin_client.get(f"/admin/jobs/{model}/").status_code == 200
    assert admin_client.get(f"/admin/jobs/{model}/add/").status_code == 403


@pytest.mark.parametrize("param", ["kind", "queue"])
def test_a_list_filter_value_with_a_nul_byte_is_an_invalid_filter_not_an_error(
    admin_client, zombie_job, param
):
    # Before: the filter reached PostgreSQL, which refuses a NUL in text (a 500).
    response = admin_client.get("/admin/jobs/job/", {param: "a\x00b"})
    assert response.status_code == 302 and response["Location"].endswith("?e=1")


@pytest.mark.parametrize("term", ["²", "١٢٣"])
def test_a_search_for_a_non_ascii_digit_is_a_key_search_not_an_error(client, make_job, term):
    # Before: str.isdigit() is true for "²" and "١٢٣", and int() of "²" raised (a 500).
    keyed = make_job(unique_key=term)
    make_job(unique_key="other")
    client.force_login(_staff("viewer", "view_job"))
    response = client.get("/admin/jobs/job/", {"q": term})
    assert response.status_code == 200
    assert [job.pk for job in response.context["cl"].result_list] == [keyed.pk]
