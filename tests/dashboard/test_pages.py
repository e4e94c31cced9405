"""Every screen renders for an operator, as a full page and as its htmx partial."""

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from jobs.models import Job
from tests.dashboard.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "name, live_region",
    [
        ("dashboard:overview", 'id="overview-stats"'),
        ("dashboard:jobs", 'id="jobs-table"'),
        ("dashboard:rejected", 'id="rejected-feed"'),
        ("dashboard:workers", 'id="workers-live"'),
    ],
)
def test_each_screen_renders_its_live_region(
    operator_client: Client, name: str, live_region: str
) -> None:
    response = operator_client.get(reverse(name))
    assert response.status_code == 200
    assert live_region in response.content.decode()


def test_htmx_request_gets_only_the_partial(operator_client: Client, make_job) -> None:
    make_job(kind="test.echo")
    response = operator_client.get(reverse("dashboard:jobs"), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="jobs-table"')
    assert "<html" not in html


# Every page whose URL also answers an htmx swap or poll with a partial.
SHARED_URLS = ["overview", "jobs", "job", "rejected", "workers", "queues", "cron"]


def url_of(name: str, job: Job) -> str:
    return reverse(f"dashboard:{name}", args=[job.pk] if name == "job" else [])


def varies(response, *headers: str) -> bool:  # type: ignore[no-untyped-def]
    vary = {h.strip().lower() for h in response.get("Vary", "").split(",")}
    return {h.lower() for h in headers} <= vary


@pytest.mark.parametrize("name", SHARED_URLS)
def test_the_page_and_its_partial_are_never_cached_one_for_the_other(
    operator_client: Client, zombie_story: Job, name: str
) -> None:
    """Before: both answers said only `Vary: Cookie`, so after a poll or a filter swap the
    browser's cache gave the fragment, unstyled, for the page when the operator pressed Back."""
    url = url_of(name, zombie_story)
    page = operator_client.get(url)
    assert "<header" in page.content.decode()
    assert varies(page, "HX-Request", "HX-History-Restore-Request", "Cookie")
    assert "no-store" not in page.get("Cache-Control", "")
    part = operator_client.get(url, headers={"HX-Request": "true"})
    assert "<header" not in part.content.decode()
    assert varies(part, "HX-Request", "HX-History-Restore-Request", "Cookie")
    assert "no-store" in part["Cache-Control"]


@pytest.mark.parametrize("name", SHARED_URLS)
def test_a_history_restore_gets_the_full_page(
    operator_client: Client, zombie_story: Job, name: str
) -> None:
    """htmx re-fetches a page it did not keep with both headers and puts the answer in place of
    the whole body: a partial there left the page without its header, filters and styles."""
    headers = {"HX-Request": "true", "HX-History-Restore-Request": "true"}
    response = operator_client.get(url_of(name, zombie_story), headers=headers)
    html = response.content.decode()
    assert "<header" in html and "dashboard.css" in html
    assert varies(response, "HX-Request")


def test_the_action_confirmation_and_its_partial_are_kept_apart(
    staff: User, zombie_story: Job
) -> None:
    staff.user_permissions.add(Permission.objects.get(codename="change_job"))
    client = client_for(staff)
    url = reverse("dashboard:job_action", args=[zombie_story.pk, "requeue"])
    page, part = client.get(url), client.get(url, headers={"HX-Request": "true"})
    assert "<header" in page.content.decode() and "<header" not in part.content.decode()
    assert varies(page, "HX-Request") and varies(part, "HX-Request")
    assert "no-store" in part["Cache-Control"]


def test_htmx_is_served_from_static_never_a_cdn(operator_client: Client) -> None:
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    assert "/static/django_htmx/htmx" in html
    assert "https://" not in html.split("<body")[0]


def test_job_page_shows_both_attempts_and_the_rejected_commit(
    operator_client: Client, zombie_story: Job
) -> None:
    html = operator_client.get(reverse("dashboard:job", args=[zombie_story.pk])).content.decode()
    assert html.count('class="lane"') == 2
    assert 'data-overlap="1"' in html
    assert "mark-rejected" in html
    assert "commit won" in html
    assert "Stale commit rejected: attempt 1 presented, 2 current" in html


def test_job_page_of_a_missing_job_is_404(operator_client: Client) -> None:
    assert operator_client.get(reverse("dashboard:job", args=[999999])).status_code == 404


def test_rejected_feed_links_to_the_job_timeline(
    operator_client: Client, zombie_story: Job
) -> None:
    html = operator_client.get(reverse("dashboard:rejected")).content.decode()
    assert f'href="/jobs/{zombie_story.pk}/#timeline"' in html
    assert "host:101" in html
    assert "4.500 s" in html  # the rejected commit came 4.5 s after attempt 1's lease expired


def test_timestamps_carry_milliseconds(operator_client: Client, zombie_story: Job) -> None:
    html = operator_client.get(reverse("dashboard:job", args=[zombie_story.pk])).content.decode()
    assert re.search(r"\d\d:\d\d:\d\d\.\d{3}\+00:00", html)


def test_workers_screen_flags_an_expired_lease(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    make_job(state="running", attempt=1, lease_in=-5, worker="host:9")
    html = operator_client.get(reverse("dashboard:workers")).content.decode()
    assert "lease expired" in html or "zombie suspect" in html
    assert "host:9" in html


def test_overview_counts_jobs_by_state(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    make_job(state="running", attempt=1, lease_in=-5)
    make_job()
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    assert 'id="expired-running">1<' in html


def test_timeline_positions_stay_css_in_a_locale_with_a_decimal_comma(
    operator_client: Client, zombie_story: Job
) -> None:
    from django.utils import translation

    with translation.override("de"):
        html = operator_client.get(reverse("dashboard:job", args=[zombie_story.pk])).content
    positions = re.findall(rb"(?:left|width): ([^;\"]*)%", html)
    assert positions and all(re.fullmatch(rb"\d+(\.\d+)?", p) for p in positions), positions[:5]


@pytest.mark.parametrize(
    "sql_payload, shown",
    [
        ("'[' || repeat('[', 4999) || repeat(']', 4999) || ']'", "[[[[["),  # too deep to decode
        ("jsonb_build_object('big', repeat('x', 200000))", "characters)"),  # cut
    ],
)
def test_a_job_page_opens_whatever_raw_sql_put_in_the_payload(
    operator_client: Client, sql_payload: str, shown: str
) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO jobs_job (kind, payload) VALUES ('test.echo', ({sql_payload})::jsonb) "
            "RETURNING id"
        )
        job_id = cur.fetchone()[0]
    response = operator_client.get(reverse("dashboard:job", args=[job_id]))
    assert response.status_code == 200
    assert shown in response.content.decode()
    assert len(response.content) < 200_000
