"""The queues and cron pages, the keyboard and the dark theme in Chromium, as an operator uses
them; a screenshot of every screen (light and dark) is saved under ARTIFACTS/screens/."""

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import expect

import jobs
from jobs.models import Job, Schedule
from tests.browser.conftest import ARTIFACTS, make_user

pytestmark = pytest.mark.browser

SHOTS = ARTIFACTS / "screens"


def operator_who_may_control(name: str) -> User:
    user = make_user(name, staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="jobs", codename__in=["change_job", "change_schedule"]
        )
    )
    return user


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def wait_for_state(job: Job, state: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if job.state == state:
            return
        time.sleep(0.05)  # poll interval of a deadline-bound wait
    raise AssertionError(f"job {job.pk} is {job.state}, not {state}, after {seconds} s")


def test_a_paused_queue_keeps_its_job_queued_while_others_run_until_resumed(
    server: str, page_as: Callable[..., Any], qcluster: Callable[..., Any]
) -> None:
    held = jobs.enqueue("test.echo", {"n": 1}, queue="mail")
    page = page_as(operator_who_may_control("boss"))
    page.goto(f"{server}/queues/")
    row = page.locator('tr[data-queue="mail"]')
    expect(row.locator('td[data-n="due"]')).to_have_text("1")
    row.get_by_role("button", name="Pause").click()
    expect(page.locator(".messages")).to_contain_text("queue mail: paused.")
    expect(page.locator('tr[data-queue="mail"] .badge')).to_have_text("paused")

    qcluster()
    control = jobs.enqueue("test.echo", {"n": 2}, queue="default")
    wait_for_state(control, "succeeded")  # the cluster runs: another queue's job went through
    held.refresh_from_db()
    assert (held.state, held.attempt) == ("queued", 0)
    page.reload()
    expect(page.locator('tr[data-queue="mail"] td[data-n="queued"]')).to_have_text("1")
    expect(page.locator('tr[data-queue="default"] td[data-n="succeeded"]')).to_have_text("1")
    shot(page, "queues-paused")

    page.locator('tr[data-queue="mail"]').get_by_role("button", name="Resume").click()
    expect(page.locator(".messages")).to_contain_text("queue mail: resumed.")
    wait_for_state(held, "succeeded")


def test_the_queues_page_sets_a_limit_and_its_charts_answer_a_hover(
    server: str, page_as: Callable[..., Any], make_job: Callable[..., Job]
) -> None:
    for state in ("succeeded", "succeeded", "failed"):
        make_job(queue="reports", state=state, attempt=1)
    page = page_as(operator_who_may_control("boss"))
    page.goto(f"{server}/queues/")
    row = page.locator('tr[data-queue="reports"]')
    row.get_by_label("concurrency limit of reports").fill("4")
    row.get_by_role("button", name="Set limit").click()
    expect(page.locator('tr[data-queue="reports"] .limit')).to_have_text("4")
    chart = page.locator("#throughput-reports svg")
    expect(chart.locator(".axis-x text").first).to_be_visible()
    last = chart.locator(".hover rect").last
    last.hover()
    assert re.search(
        r"succeeded \d jobs/min, failed \d jobs/min", last.locator("title").text_content() or ""
    )
    shot(page, "queues")


def test_the_cron_page_runs_a_schedule_now_and_disables_it(
    server: str, page_as: Callable[..., Any]
) -> None:
    Schedule.objects.create(
        name="nightly-report",
        kind="test.echo",
        cron="30 2 * * 1-5",
        timezone="Europe/Paris",
        next_at=datetime.now(UTC) + timedelta(hours=3),
    )
    page = page_as(operator_who_may_control("boss"))
    page.goto(f"{server}/cron/")
    row = page.locator('tr[data-schedule="nightly-report"]')
    expect(row).to_contain_text("At 02:30, Monday through Friday")
    expect(row).to_contain_text("Europe/Paris")
    expect(row.locator("time.rel").first).to_have_text(re.compile(r"^in 2 h|^in 3 h"))
    row.get_by_role("button", name="Run now").click()
    job = Job.objects.get()
    expect(page.locator(".messages")).to_contain_text(f"enqueued job {job.pk}")
    expect(
        page.locator(f'tr[data-schedule="nightly-report"] a[href="/jobs/{job.pk}/"]')
    ).to_be_visible()
    page.locator('tr[data-schedule="nightly-report"]').get_by_role("button", name="Disable").click()
    expect(page.locator('tr[data-schedule="nightly-report"] .badge.alarm')).to_have_text("disabled")
    assert not Schedule.objects.get(name="nightly-report").enabled
    shot(page, "cron")


def test_the_keyboard_moves_between_rows_and_screens(
    server: str, page_as: Callable[..., Any], make_job: Callable[..., Job]
) -> None:
    make_job(queue="alpha")
    make_job(queue="beta")
    page = page_as(make_user("reader"))
    page.goto(f"{server}/queues/")
    page.keyboard.press("j")
    expect(page.locator("tr.selected")).to_have_attribute("data-queue", "alpha")
    page.keyboard.press("j")
    expect(page.locator("tr.selected")).to_have_attribute("data-queue", "beta")
    page.keyboard.press("k")
    expect(page.locator("tr.selected")).to_have_attribute("data-queue", "alpha")
    page.keyboard.press("Enter")
    page.wait_for_url("**/jobs/?queue=alpha")
    page.keyboard.press("g")
    page.keyboard.press("c")
    page.wait_for_url("**/cron/")
    page.keyboard.press("?")
    expect(page.locator("dialog#shortcuts")).to_be_visible()
    shot(page, "shortcuts")
    page.keyboard.press("Escape")
    expect(page.locator("dialog#shortcuts")).to_be_hidden()
    page.keyboard.press("/")  # no search box here: the jobs list's, focused
    page.wait_for_url("**/jobs/#search")
    expect(page.locator("#id_q")).to_be_focused()
    page.keyboard.type("g")  # typing in a box is never a shortcut
    expect(page.locator("#id_q")).to_have_value("g")
    page.locator("#id_q").blur()
    page.keyboard.press("g")
    page.keyboard.press("q")
    page.wait_for_url("**/queues/")
    page.keyboard.press("g")
    page.keyboard.press("o")
    page.wait_for_url(f"{server}/")


def test_copy_as_json_puts_the_payload_on_the_clipboard(
    server: str, page_as: Callable[..., Any], make_job: Callable[..., Job]
) -> None:
    job = make_job(state="succeeded", attempt=1, payload={"order": 7}, result={"pages": 3})
    page = page_as(make_user("reader"))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    page.goto(f"{server}/jobs/{job.pk}/")
    page.locator('button[data-copy="payload"]').click()
    expect(page.locator('button[data-copy="payload"]')).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == '{\n  "order": 7\n}'
    page.locator('button[data-copy="result"]').click()
    expect(page.locator('button[data-copy="result"]')).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == '{\n  "pages": 3\n}'


def test_relative_times_show_the_exact_millisecond_on_hover(
    server: str, page_as: Callable[..., Any], make_job: Callable[..., Job]
) -> None:
    make_job(queue="mail", run_at=datetime.now(UTC) - timedelta(minutes=3))
    page = page_as(make_user("reader"))
    page.goto(f"{server}/queues/")
    when = page.locator('tr[data-queue="mail"] td[data-n="oldest"] time.rel')
    expect(when).to_have_text(re.compile(r"^3 min \d+ s ago$"))
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", when.get_attribute("title")
    )


SCREENS = ["/", "/jobs/", "/jobs/{job}/", "/rejected/", "/workers/", "/queues/", "/cron/"]


def test_the_dark_theme_follows_the_system_on_every_screen(
    server: str, page_as: Callable[..., Any], make_job: Callable[..., Job]
) -> None:
    job = make_job(state="running", attempt=1, payload={"order": 7})
    Schedule.objects.create(
        name="digest", kind="test.echo", cron="*/15 * * * *", next_at=datetime.now(UTC)
    )
    page = page_as(make_user("reader"))
    for scheme, background in (("light", "rgb(255, 255, 255)"), ("dark", "rgb(13, 17, 23)")):
        page.emulate_media(color_scheme=scheme)
        for path in SCREENS:
            page.goto(server + path.format(job=job.pk))
            assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background
            name = path.strip("/").replace("/", "-").replace("{job}", "job") or "overview"
            shot(page, f"{name}-{scheme}")
