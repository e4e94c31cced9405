"""Who sees and who presses: login for every page, a permission to see, staff + CSRF to act."""

from collections.abc import Callable
from unittest import mock

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import Attempt, Job, RejectedWrite
from tests.dashboard.conftest import client_for

pytestmark = pytest.mark.django_db

SCREENS = [
    "dashboard:overview",
    "dashboard:jobs",
    "dashboard:job",  # payload, result, errors and tracebacks
    "dashboard:job-events",
    "dashboard:rejected",
    "dashboard:workers",
    "dashboard:queues",
    "dashboard:cron",
]
SECRET = "s3cret-in-the-payload"


@pytest.fixture
def shown(make_job: Callable[..., Job]) -> Job:
    """A real job for the job pages, so a refusal cannot be mistaken for a 404."""
    return make_job(payload={"secret": SECRET}, error=SECRET)


def screen_url(name: str, job: Job) -> str:
    if name in {"dashboard:job", "dashboard:job-events"}:
        return reverse(name, args=[job.pk])
    return reverse(name)


@pytest.mark.parametrize("name", SCREENS)
def test_anonymous_visitor_is_sent_to_login(client: Client, shown: Job, name: str) -> None:
    response = client.get(screen_url(name, shown))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("dashboard:login"))


@pytest.mark.parametrize("name", SCREENS)
def test_logged_in_user_without_the_view_permission_is_refused(
    outsider: User, shown: Job, name: str
) -> None:
    response = client_for(outsider).get(screen_url(name, shown))
    assert response.status_code == 403
    assert SECRET not in response.content.decode()


def test_read_only_operator_sees_no_drill_button(operator_client: Client) -> None:
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    assert "drill-button" not in html
    assert "read-only" in html


def test_staff_with_the_drill_permission_sees_the_drill_button(staff_client: Client) -> None:
    assert "drill-button" in staff_client.get(reverse("dashboard:overview")).content.decode()


def test_read_only_operator_cannot_run_the_drill(operator_client: Client) -> None:
    assert operator_client.post(reverse("dashboard:drill")).status_code == 403
    assert not Job.objects.exists()


def test_a_user_who_is_not_staff_cannot_run_the_drill_even_with_its_permission(
    unstaffed: User,
) -> None:
    client = client_for(unstaffed)
    for name in ("dashboard:overview", "dashboard:queues", "dashboard:cron"):
        assert "drill-button" not in client.get(reverse(name)).content.decode()
    with mock.patch("demo.drill.run_in_background", return_value=True) as started:
        assert client.post(reverse("dashboard:drill")).status_code == 403
    assert not started.called and not Job.objects.exists()


def test_staff_without_the_drill_permission_cannot_run_the_drill() -> None:
    user = User.objects.create_user("staff-no-drill", password="pw", is_staff=True)
    for app_label, codename in [
        ("dashboard", "view_dashboard"),
        ("jobs", "change_job"),
        ("jobs", "change_schedule"),
    ]:  # may press everything but the drill
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    client = client_for(user)
    assert "drill-button" not in client.get(reverse("dashboard:overview")).content.decode()
    with mock.patch("demo.drill.run_in_background", return_value=True) as started:
        assert client.post(reverse("dashboard:drill")).status_code == 403
    assert not started.called and not Job.objects.exists()


def test_the_migration_creates_the_operators_group_holding_only_the_view_permission() -> None:
    """The dashboard's migration, run back and forward as on a new database (no group, no
    dashboard permissions yet): the `operator` fixture makes its group itself, so only this test
    checks what the migration makes."""
    executor = MigrationExecutor(connection)
    executor.migrate([("dashboard", None)])
    Group.objects.filter(name="operators").delete()
    Permission.objects.filter(content_type__app_label="dashboard").delete()
    executor.loader.build_graph()  # it reads the applied migrations again
    executor.migrate([("dashboard", "0001_initial")])
    group = Group.objects.get(name="operators")
    held = [f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()]
    assert held == ["dashboard.view_dashboard"]
    assert Permission.objects.filter(content_type__app_label="dashboard").count() == 2


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
        kind=HOSTILE,  # no handler's: a row planted by SQL or the admin, shown all the same
        queue=HOSTILE,  # no queue a producer may name: planted too
        state="running",
        attempt=1,
        worker=HOSTILE,
        payload={"x": HOSTILE},
        unique_key=HOSTILE,
        error=HOSTILE,
    )
    RejectedWrite.objects.create(  # its worker's stale write, in the feed and on the job page
        job=job,
        attempt_presented=1,
        attempt_current=2,
        state_current="running",
        worker=HOSTILE,
        write="commit",
        at=timezone.now(),
    )
    handed_on = make_job(state="running", attempt=2, worker="host:2")
    Attempt.objects.create(  # its lease ran out, nothing heard since: a zombie suspect
        job=handed_on,
        number=1,
        worker=HOSTILE,
        claimed_at=timezone.now(),
        ended_at=timezone.now(),
        outcome="expired",
    )
    for url in [
        reverse("dashboard:job", args=[job.pk]),
        reverse("dashboard:jobs"),
        reverse("dashboard:workers"),
        reverse("dashboard:rejected"),
        reverse("dashboard:overview"),
        reverse("dashboard:queues"),
    ]:
        html = operator_client.get(url).content.decode()
        assert HOSTILE not in html
        assert "&lt;script&gt;" in html
