"""Who sees and who presses: login for every page, a permission to see, staff + CSRF to act."""

from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from jobs.models import Job
from tests.dashboard.conftest import client_for

pytestmark = pytest.mark.django_db

SCREENS = ["dashboard:overview", "dashboard:jobs", "dashboard:rejected", "dashboard:workers"]


@pytest.mark.parametrize("name", SCREENS)
def test_anonymous_visitor_is_sent_to_login(client: Client, name: str) -> None:
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("dashboard:login"))


def test_logged_in_user_without_the_view_permission_is_refused(outsider: User) -> None:
    assert client_for(outsider).get(reverse("dashboard:jobs")).status_code == 403


def test_read_only_operator_sees_no_drill_button(operator_client: Client) -> None:
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    assert "drill-button" not in html
    assert "read-only" in html


def test_staff_with_the_drill_permission_sees_the_drill_button(staff_client: Client) -> None:
    assert "drill-button" in staff_client.get(reverse("dashboard:overview")).content.decode()


def test_read_only_operator_cannot_run_the_drill(operator_client: Client) -> None:
    assert operator_client.post(reverse("dashboard:drill")).status_code == 403
    assert not Job.objects.exists()


def test_drill_needs_post(staff_client: Client) -> None:
    assert staff_client.get(reverse("dashboard:drill")).status_code == 405


def test_drill_without_csrf_token_is_refused(staff: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.post(reverse("dashboard:drill")).status_code == 403
    assert not Job.objects.exists()


def test_staff_drill_enqueues_the_slow_job_and_opens_its_page(staff_client: Client) -> None:
    with mock.patch("demo.drill.run_in_background", return_value=True) as started:
        response = staff_client.post(reverse("dashboard:drill"))
    job = Job.objects.get(kind="demo.drill")
    started.assert_called_once_with(job.pk)
    assert response["Location"] == reverse("dashboard:job", args=[job.pk])


HOSTILE = "<script>window.pwned=1</script>"


def test_hostile_payload_kind_error_and_worker_render_as_text(
    operator_client: Client, make_job
) -> None:
    job = make_job(
        kind="test.echo",
        state="running",
        attempt=1,
        worker=HOSTILE,
        payload={"x": HOSTILE},
        unique_key=HOSTILE,
        error=HOSTILE,
    )
    for url in [
        reverse("dashboard:job", args=[job.pk]),
        reverse("dashboard:jobs"),
        reverse("dashboard:workers"),
    ]:
        html = operator_client.get(url).content.decode()
        assert HOSTILE not in html
        assert "&lt;script&gt;" in html
