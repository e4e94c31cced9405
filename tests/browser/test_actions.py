"""Acting where you look, in Chromium: requeue a job a real cluster is running and watch its
worker's later commit refused; cancel everything matching a filter of 20,000 jobs with progress.
Screenshots go to ARTIFACTS (var/test-artifacts, git-ignored)."""

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from playwright.sync_api import expect

import jobs
from jobs.models import Job, RejectedWrite
from tests.acceptance.cluster import (
    HEARTBEAT_SECONDS,
    database_now,
    wait_for_attempt,
    wait_for_db_clock_past,
    wait_until,
    worker_pid,
)
from tests.browser.conftest import ARTIFACTS, make_user

pytestmark = pytest.mark.browser
FIRST_SECONDS = 1.0  # attempt 1's sleep: over while its worker is stopped


def presser(name: str) -> User:
    user = make_user(name, staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_job"))
    return User.objects.get(pk=user.pk)


def test_requeue_from_the_job_page_takes_the_job_back_and_its_workers_commit_is_refused(
    server: str, page_as: Callable[..., Any], qcluster: Callable[..., Any]
) -> None:
    # A long lease: only the operator's requeue takes attempt 1 away, never the reaper.
    job = jobs.enqueue(
        "test.sleep", {"seconds_by_attempt": {"1": FIRST_SECONDS}, "seconds": 0.2}, lease_seconds=60
    )
    page = page_as(presser("boss"))
    page.goto(f"{server}/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_text("live")
    cluster = qcluster()
    first = wait_for_attempt(job.pk, 1, poll=0.01)
    zombie = worker_pid(first.worker)
    wait_until(
        lambda: cluster.sleeping(zombie),
        timeout=5,
        what="attempt 1's handler to sleep",
        job_id=job.pk,
        poll=0.002,
    )
    cluster.pause(zombie)  # inside its sleep, before its first background heartbeat (see
    paused_at = database_now()  # pause_first_attempt_until_reclaimed): its commit comes first
    first.refresh_from_db()
    assert first.heartbeat_at - first.claimed_at < timedelta(seconds=HEARTBEAT_SECONDS / 2), (
        "the worker was stopped only after its first heartbeat: its commit may never be presented"
    )
    try:
        expect(page.locator("#job-state")).to_have_text("Running")
        page.locator("#action-requeue").click()
        note = page.locator("#fence-note")
        expect(note).to_contain_text(
            f"attempt 1 is running on {first.worker}; its later writes will be refused"
        )
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "job-requeue-confirm.png"))
        page.locator("#confirm-action").click()
        expect(page.locator("#action-outcome")).to_have_text(
            "Requeue: running -> queued (fenced by attempt 1)."
        )
        wait_for_db_clock_past(job.pk, paused_at, FIRST_SECONDS)
    finally:
        cluster.resume(zombie)
    rejected = page.locator("#job-rejected tr.rejected")
    expect(rejected.first).to_contain_text("Commit", timeout=40_000)
    expect(page.locator("#timeline .mark-rejected").first).to_be_visible()
    expect(page.locator("#job-state")).to_have_text("Succeeded", timeout=40_000)
    page.screenshot(path=str(ARTIFACTS / "job-requeue-rejected-commit.png"), full_page=True)
    refused = RejectedWrite.objects.get(job=job, attempt_presented=1)
    assert (refused.write, refused.worker) == ("commit", first.worker)
    assert Job.objects.get(pk=job.pk).attempt == 2
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert "requeue (dashboard), fenced by attempt 1" in entry.change_message


BULK_SECONDS = 300.0  # ~30 s here; once >120 s in a clean-clone CI run (pytest-timeout's own)


def _wait_until_done(page: Any, box: Any, *, seconds: float) -> None:
    """Wait (with a deadline) for the run to say it is done; if it does not, say how far it got
    and when, so a slow run tells a stalled one from a slow one."""
    started = time.monotonic()
    seen: list[tuple[float, str | None]] = []
    while True:
        try:
            expect(box).to_have_attribute("data-done", "1", timeout=5_000)
            return
        except AssertionError as exc:
            waited = time.monotonic() - started
            seen.append((round(waited), page.locator("#bulk-progress").get_attribute("value")))
            if waited > seconds:
                why = f"not done after {seconds:.0f} s; (seconds, jobs done): {seen}"
                raise AssertionError(why) from exc


@pytest.mark.timeout(BULK_SECONDS + 120)  # its own deadline decides, not the suite's 120 s
def test_bulk_cancel_of_everything_matching_a_filter_of_20000_jobs_shows_its_progress(
    server: str, page_as: Callable[..., Any]
) -> None:
    total = 20_000
    Job.objects.bulk_create(
        [Job(kind="test.echo", queue="bulk", payload={"n": n}) for n in range(total)],
        batch_size=5_000,
    )
    other = jobs.enqueue("test.echo", {"n": -1}, queue="default")
    page = page_as(presser("bulky"))
    page.goto(f"{server}/jobs/?queue=bulk")
    page.locator("#bulk-action").select_option("cancel")
    page.locator("#scope-matching").check()
    page.locator("#bulk-apply").click()
    expect(page.locator("#bulk-count")).to_have_text(str(total))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "jobs-bulk-confirm.png"))
    page.locator("#bulk-run").click()
    box = page.locator("#bulk-progress-box")
    expect(box).to_have_attribute("data-done", "0")  # a chunk is done, more to go
    seen = int(page.locator("#bulk-progress").get_attribute("value") or 0)
    assert 0 < seen < total
    page.screenshot(path=str(ARTIFACTS / "jobs-bulk-progress.png"))
    _wait_until_done(page, box, seconds=BULK_SECONDS)
    expect(page.locator("#bulk-changed")).to_have_text(str(total))
    expect(page.locator("#bulk-skipped")).to_have_text("0")
    page.screenshot(path=str(ARTIFACTS / "jobs-bulk-done.png"))
    assert Job.objects.filter(queue="bulk", state="cancelled").count() == total
    assert Job.objects.get(pk=other.pk).state == "queued"
    assert LogEntry.objects.count() == total


def test_ticked_rows_survive_a_live_rerender_and_only_they_are_cancelled(
    server: str, page_as: Callable[..., Any]
) -> None:
    a, b, c = (jobs.enqueue("test.echo", {"n": n}, queue="picked") for n in range(3))
    page = page_as(presser("picker"))
    page.goto(f"{server}/jobs/?queue=picked")
    expect(page.locator("#live-status")).to_have_text("live")
    page.locator(f'#job-row-{a.pk} input[name="ids"]').check()
    page.locator(f'#job-row-{c.pk} input[name="ids"]').check()
    expect(page.locator("#selected-count")).to_have_text("2")
    newer = jobs.enqueue("test.echo", {"n": 3}, queue="picked")  # the first page is pushed again
    expect(page.locator(f"#job-row-{newer.pk}")).to_be_visible()
    expect(page.locator(f'#job-row-{a.pk} input[name="ids"]')).to_be_checked()
    expect(page.locator(f'#job-row-{b.pk} input[name="ids"]')).not_to_be_checked()
    page.locator("#bulk-action").select_option("cancel")
    page.locator("#bulk-apply").click()
    expect(page.locator("#bulk-count")).to_have_text("2")
    page.locator("#bulk-run").click()
    expect(page.locator("#bulk-progress-box")).to_have_attribute("data-done", "1")
    expect(page.locator("#bulk-changed")).to_have_text("2")
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[j.pk] for j in (a, b, c, newer)] == [
        "cancelled",
        "queued",
        "cancelled",
        "queued",
    ]
