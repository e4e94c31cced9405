"""The cron page: schedules in words with their runs, the staff-only buttons (CSRF, audited),
escaping of hostile names, and bounded queries."""

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard import cron as cron_page
from jobs.models import Attempt, Job, Schedule
from tests.dashboard.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def controller(staff: User) -> User:
    """Staff with the dashboard's permissions and jobs.change_schedule."""
    staff.user_permissions.add(
        Permission.objects.get(codename="change_schedule", content_type__app_label="jobs")
    )
    return User.objects.get(pk=staff.pk)  # permissions are cached per instance


def plant(name: str = "nightly", cron: str = "0 3 * * 1-5", **fields) -> Schedule:
    return Schedule.objects.create(
        name=name,
        kind="test.echo",
        cron=cron,
        timezone="Europe/Paris",
        next_at=datetime.now(UTC) + timedelta(hours=2),
        **fields,
    )


def test_each_schedule_shows_its_expression_in_words_time_zone_and_next_run(
    operator_client: Client,
) -> None:
    plant()
    html = operator_client.get(reverse("dashboard:cron")).content.decode()
    assert "At 03:00, Monday through Friday" in html
    assert "Europe/Paris" in html
    assert '<time class="rel"' in html and "local</small>" in html


def test_the_last_runs_show_outcome_and_duration_newest_first(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    plant()
    older = make_job(state="failed", attempt=1, unique_key="schedule:nightly:2026-01-01T02:00:00Z")
    newer = make_job(
        state="succeeded", attempt=1, unique_key="schedule:nightly:2026-01-02T02:00:00Z"
    )
    make_job(state="succeeded", attempt=1, unique_key="schedule:nightly-other:2026-01-02T02:00Z")
    start = datetime(2026, 1, 2, 2, tzinfo=UTC)
    Attempt.objects.create(
        job=newer,
        number=1,
        worker="h:1",
        claimed_at=start,
        ended_at=start + timedelta(seconds=2.5),
        outcome="succeeded",
    )
    html = operator_client.get(reverse("dashboard:cron")).content.decode()
    runs = html[html.index('<ul class="runs">') : html.index("</ul>")]
    assert runs.index(f"#{newer.pk}") < runs.index(f"#{older.pk}")
    assert "Succeeded" in runs and "Failed" in runs and "2.5 s" in runs
    assert runs.count("<li>") == 2  # the other schedule's run is not this one's


def test_the_page_reads_every_schedules_runs_in_one_statement(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    """The query count does not grow with the schedules; each keeps its own runs, newest first,
    even when one name is a LIKE pattern of another's ("a_b%" is not "axb...")."""
    counts = []
    for names in (["a_b%"], ["a_b%", "axbc", "nightly", "hourly", "weekly"]):
        for name in names:
            if not Schedule.objects.filter(name=name).exists():
                plant(name)
                for day in (1, 2, 3, 4, 5, 6):
                    make_job(
                        state="succeeded",
                        attempt=1,
                        unique_key=f"schedule:{name}:2026-01-0{day}T02:00:00Z",
                    )
        with CaptureQueriesContext(connection) as ran:
            response = operator_client.get(reverse("dashboard:cron"))
        counts.append(len(ran.captured_queries))
    rows = {r.schedule.name: r.runs for r in response.context["schedules"]}
    assert counts[0] == counts[1], counts
    for name, runs in rows.items():
        keys = [run.job.unique_key for run in runs]
        assert len(keys) == 5  # its last five runs (of six), as docs/dashboard.md says
        assert all(k.startswith(f"schedule:{name}:") for k in keys), (name, keys)
        assert keys == sorted(keys, reverse=True)


def test_a_schedules_runs_are_read_from_their_partial_index() -> None:
    qs = cron_page.runs_query(plant()).query
    sql, params = qs.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    assert "jobs_job_schedule_runs_idx" in plan


@pytest.mark.parametrize(
    "expression, words",
    [
        ("*/15 * * * *", "Every 15 minutes"),
        ("@daily", "At 00:00"),
        ("0 3 * * * 30", "At 03:00:30"),  # croniter's sixth field is seconds
        ("not a cron", ""),
    ],
)
def test_describe(expression: str, words: str) -> None:
    assert cron_page.describe(expression) == words


def test_a_viewer_sees_no_buttons_and_may_not_press(operator_client: Client) -> None:
    plant()
    html = operator_client.get(reverse("dashboard:cron")).content.decode()
    assert "Run now" not in html
    response = operator_client.post(
        reverse("dashboard:cron-action"), {"name": "nightly", "action": "disable"}
    )
    assert response.status_code == 403
    assert Schedule.objects.get(name="nightly").enabled


def test_a_user_who_is_not_staff_sees_no_buttons_and_may_not_press_even_with_the_permission(
    unstaffed: User,
) -> None:
    plant()
    plant(name="weekly", enabled=False)
    client = client_for(unstaffed)
    html = client.get(reverse("dashboard:cron")).content.decode()
    assert "Run now" not in html and reverse("dashboard:cron-action") not in html
    url = reverse("dashboard:cron-action")
    for name, action in [("nightly", "run"), ("nightly", "disable"), ("weekly", "enable")]:
        assert client.post(url, {"name": name, "action": action}).status_code == 403, action
    assert Schedule.objects.get(name="nightly").enabled
    assert not Schedule.objects.get(name="weekly").enabled
    assert not Job.objects.exists() and not LogEntry.objects.exists()


def test_staff_without_the_change_permission_may_not_press(staff_client: Client) -> None:
    plant()
    response = staff_client.post(
        reverse("dashboard:cron-action"), {"name": "nightly", "action": "run"}
    )
    assert response.status_code == 403 and not Job.objects.exists()


def test_staff_disables_runs_now_and_enables_from_the_page_audited(controller: User) -> None:
    plant()
    client = client_for(controller)
    html = client.get(reverse("dashboard:cron")).content.decode()
    assert "Run now" in html and 'name="csrfmiddlewaretoken"' in html
    url = reverse("dashboard:cron-action")
    page = client.post(url, {"name": "nightly", "action": "disable"}, follow=True)
    assert "nightly: disabled." in page.content.decode()
    assert not Schedule.objects.get(name="nightly").enabled
    page = client.post(url, {"name": "nightly", "action": "run"}, follow=True)
    job = Job.objects.get()
    assert f"nightly: enqueued job {job.pk}." in page.content.decode()
    client.post(url, {"name": "nightly", "action": "enable"})
    assert Schedule.objects.get(name="nightly").enabled
    messages = list(LogEntry.objects.order_by("id").values_list("change_message", flat=True))
    assert messages == [
        "disabled (dashboard)",
        f"run now (dashboard): enqueued job {job.pk}",
        messages[2],
    ]
    assert messages[2].startswith("enabled (dashboard), next tick ")


def test_an_action_needs_the_csrf_token(controller: User) -> None:
    plant()
    client = Client(enforce_csrf_checks=True)
    client.force_login(controller)
    response = client.post(reverse("dashboard:cron-action"), {"name": "nightly", "action": "run"})
    assert response.status_code == 403 and not Job.objects.exists()


def test_a_refused_action_says_why_and_changes_nothing(controller: User) -> None:
    plant()
    Schedule.objects.filter(name="nightly").update(kind="gone.kind")
    page = client_for(controller).post(
        reverse("dashboard:cron-action"), {"name": "nightly", "action": "run"}, follow=True
    )
    assert "refused by enqueue" in page.content.decode() and not Job.objects.exists()


@pytest.mark.parametrize("action", ["run", "enable"])
def test_a_schedule_no_longer_declared_is_neither_run_nor_enabled_and_the_page_says_why(
    controller: User, action: str
) -> None:
    plant(enabled=False, source="undeclared")  # how cron.sync leaves it
    page = client_for(controller).post(
        reverse("dashboard:cron-action"), {"name": "nightly", "action": action}, follow=True
    )
    assert "is no longer declared" in page.content.decode()
    assert not Schedule.objects.get(name="nightly").enabled and not Job.objects.exists()


@pytest.mark.parametrize("action", ["run", "disable"])
def test_a_schedule_name_with_a_nul_byte_is_no_schedule_not_an_error(
    controller: User, action: str
) -> None:
    plant()  # before: the lookup of "night\x00ly" was refused by PostgreSQL (a 500)
    page = client_for(controller).post(
        reverse("dashboard:cron-action"), {"name": "night\x00ly", "action": action}, follow=True
    )
    assert page.status_code == 200 and "no schedule named" in page.content.decode()
    assert Schedule.objects.get(name="nightly").enabled and not Job.objects.exists()


def test_a_hostile_schedule_name_renders_as_text_and_its_buttons_still_work(
    controller: User,
) -> None:
    hostile = '"><script>alert(1)</script>'
    plant(name=hostile)
    client = client_for(controller)
    html = client.get(reverse("dashboard:cron")).content.decode()
    assert "<script>alert(1)" not in html
    assert 'value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in html
    client.post(reverse("dashboard:cron-action"), {"name": hostile, "action": "disable"})
    assert not Schedule.objects.get(name=hostile).enabled


def test_the_cron_page_needs_login(client: Client) -> None:
    response = client.get(reverse("dashboard:cron"))
    assert response.status_code == 302 and reverse("dashboard:login") in response["Location"]


def test_the_page_shows_the_first_hundred_schedules_by_name_and_says_so(
    operator_client: Client,
) -> None:
    # dashboard.md: "per schedule (the first 100 by name)"; the admin lists them all.
    shown = cron_page.SCHEDULES_SHOWN
    for i in reversed(range(shown + 5)):
        plant(name=f"tenant-{i:04}")
    html = operator_client.get(reverse("dashboard:cron")).content.decode()
    names = re.findall(r'data-schedule="([^"]+)"', html)
    assert names == [f"tenant-{i:04}" for i in range(shown)]
    assert f"The first {shown} of {shown + 5} schedules by name" in html
