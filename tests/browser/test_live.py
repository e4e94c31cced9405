"""What an operator sees in a real browser: live transitions, the zombie drill, roles, escaping."""

import time
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

import jobs
from jobs.models import Job
from tests.browser.conftest import ARTIFACTS, make_user

pytestmark = pytest.mark.browser


def _screenshot(page: Any, selector: str, name: str, timeout: float = 15.0) -> None:
    """An artifact of `selector`, taken again when a live swap replaces the element mid-shot (a
    late rejected write of the zombie re-renders the timeline after the job has succeeded)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            page.locator(selector).screenshot(path=str(ARTIFACTS / name), timeout=3_000)
            return
        except PlaywrightError:
            if time.monotonic() > deadline:
                raise


def test_job_goes_queued_running_succeeded_live_without_a_reload(
    server: str, page_as: Callable[..., Any], qcluster: Callable[..., Any]
) -> None:
    job = jobs.enqueue("test.sleep", {"seconds": 1.5})
    page = page_as(make_user("watcher"))
    page.goto(f"{server}/jobs/{job.pk}/")
    expect(page.locator("#job-state")).to_have_text("Queued")
    expect(page.locator("#live-status")).to_have_text("live")
    page.evaluate("window.__notReloaded = true")
    qcluster()
    expect(page.locator("#job-state")).to_have_text("Running")
    expect(page.locator("#job-state")).to_have_text("Succeeded")
    assert page.evaluate("window.__notReloaded") is True
    expect(page.locator(".bar.won")).to_have_count(1)


def test_the_drill_shows_two_overlapping_attempts_and_a_rejected_write(
    server: str, page_as: Callable[..., Any], qcluster: Callable[..., Any]
) -> None:
    qcluster()
    page = page_as(make_user("boss", staff=True))
    page.goto(f"{server}/")
    page.locator("#drill-button").click()
    page.wait_for_url("**/jobs/*/")
    expect(page.locator("#live-status")).to_have_text("live")
    page.evaluate("window.__notReloaded = true")
    expect(page.locator("#timeline .lane")).to_have_count(2, timeout=40_000)
    # The resumed zombie's commit or its heartbeat, whichever it presents first (or both).
    expect(page.locator("#timeline .mark-rejected").first).to_be_visible(timeout=40_000)
    expect(page.locator("#timeline")).to_have_attribute("data-overlap", "1")
    expect(page.locator("#job-state")).to_have_text("Succeeded")
    assert page.evaluate("window.__notReloaded") is True  # all of it arrived live
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _screenshot(page, "#timeline", "drill-timeline.png")
    job_path = page.url.removeprefix(server)
    page.goto(f"{server}/rejected/")
    expect(page.locator(f'#rejected-feed a[href="{job_path}#timeline"]').first).to_be_visible()


def test_read_only_operator_sees_no_drill_button(server: str, page_as: Callable[..., Any]) -> None:
    page = page_as(make_user("reader"))
    page.goto(f"{server}/")
    expect(page.locator("#overview-stats")).to_be_visible()
    expect(page.locator("#drill-button")).to_have_count(0)


def test_hostile_payload_text_renders_inert(server: str, page_as: Callable[..., Any]) -> None:
    hostile = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"
    job = Job.objects.create(kind=hostile, payload={"note": hostile}, unique_key=hostile)
    page = page_as(make_user("reader"))
    for path in (f"/jobs/{job.pk}/", "/jobs/"):
        page.goto(f"{server}{path}")
        expect(page.get_by_text("window.pwned = 1").first).to_be_visible()
        assert page.evaluate("window.pwned") is None
