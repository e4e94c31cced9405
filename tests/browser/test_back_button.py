"""Back to a page whose URL also answered an htmx swap or poll brings the whole page back (its
header, filters and styles), never the browser's cached fragment (dashboard.views.kept_apart)."""

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from jobs.models import Job
from tests.browser.conftest import make_user
from tests.browser.test_poll_focus import POLL_MS

pytestmark = pytest.mark.browser


def test_back_to_a_filtered_jobs_list_shows_the_whole_page(
    server: str, page_as: Callable[..., Any], make_job: Callable[..., Job]
) -> None:
    done = make_job(state="succeeded", attempt=1)
    make_job()
    page = page_as(make_user("reader"))
    page.goto(f"{server}/jobs/")
    with page.expect_response(lambda r: "state=succeeded" in r.url):
        page.select_option("#id_state", "succeeded")  # an htmx swap of the table, URL pushed
    expect(page).to_have_url(re.compile(r"/jobs/\?.*state=succeeded"))
    expect(page.locator("#jobs-table tr[data-job]")).to_have_count(1)
    page.locator(f"#job-row-{done.pk} a").click()
    expect(page).to_have_url(f"{server}/jobs/{done.pk}/")
    page.go_back()
    expect(page).to_have_url(re.compile(r"/jobs/\?.*state=succeeded"))
    expect(page.locator("header.top")).to_have_count(1)  # before: the bare table, unstyled
    expect(page.locator("#job-filters")).to_have_count(1)
    expect(page.locator("#id_state")).to_have_value("succeeded")
    expect(page.locator("#jobs-table tr[data-job]")).to_have_count(1)


def test_back_to_a_polled_page_shows_the_whole_page(
    server: str, page_as: Callable[..., Any]
) -> None:
    page = page_as(make_user("reader"))
    page.goto(f"{server}/queues/")
    with page.expect_response(
        lambda r: urlsplit(r.url).path == "/queues/" and r.request.headers.get("hx-request"),
        timeout=POLL_MS,
    ):
        pass  # the poll: the same URL, answered with the partial
    page.locator("header nav a[href='/jobs/']").click()
    expect(page).to_have_url(f"{server}/jobs/")
    page.go_back()
    expect(page).to_have_url(f"{server}/queues/")
    expect(page.locator("header.top")).to_have_count(1)  # before: the bare section, unstyled
    expect(page.locator("#queues-live")).to_have_count(1)
