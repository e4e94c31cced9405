"""The queues and cron pages refresh their numbers by an htmx poll (docs/dashboard.md, "Queues
and cron"), which waits while a box of the page has the focus so a limit being typed is not
wiped -- in Chromium, against the server's real poll.

The period is dashboard.operate.POLL_SECONDS, a constant of the web server process (no setting
shortens it), so each test takes a few poll periods of wall time; every wait has a deadline.
"""

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import Permission, User
from playwright.sync_api import expect

import jobs
from dashboard.operate import POLL_SECONDS
from jobs.models import Job, Schedule
from tests.browser.conftest import make_user

pytestmark = pytest.mark.browser

FOCUS_FILTER = "main input:focus"  # the selector of the poll's filter in queues.html
MARGIN_SECONDS = 5.0  # slack, on top of the poll periods a wait allows, for a loaded machine
POLL_MS = (POLL_SECONDS + MARGIN_SECONDS) * 1000  # one poll period and the slack, for `expect`

# Counts the poll ticks whose filter found a box focused, i.e. the ticks the poll let pass.
COUNT_WAITING_TICKS = """selector => {
  window.__waitingTicks = 0;
  const original = document.querySelector.bind(document);
  document.querySelector = (s) => {
    const found = original(s);
    if (s === selector && found !== null) window.__waitingTicks += 1;
    return found;
  };
}"""


def operator(name: str) -> User:
    """Staff who may pause and limit queues: the queues page shows them the limit box."""
    user = make_user(name, staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_job"))
    return User.objects.get(pk=user.pk)


def htmx_requests(page: Any, path: str) -> list[str]:
    """The htmx requests the page makes to `path` from now on (the poll's), appended as made."""
    seen: list[str] = []

    def on_request(request: Any) -> None:
        if request.headers.get("hx-request") == "true" and urlsplit(request.url).path == path:
            seen.append(request.url)

    page.on("request", on_request)
    return seen


def test_the_queues_poll_waits_while_a_limit_is_typed_and_resumes_on_blur(
    server: str, page_as: Callable[..., Any]
) -> None:
    jobs.enqueue("test.echo", {"n": 1}, queue="mail")
    page = page_as(operator("boss"))
    polls = htmx_requests(page, "/queues/")
    page.goto(f"{server}/queues/")
    row = page.locator('tr[data-queue="mail"]')
    queued = row.locator('td[data-n="queued"]')
    expect(queued).to_have_text("1")
    box = row.get_by_label("concurrency limit of mail")
    box.click()
    box.press_sequentially("1")  # the first digit of "12": the operator is mid-value
    expect(box).to_be_focused()
    page.evaluate(COUNT_WAITING_TICKS, FOCUS_FILTER)
    page.evaluate("window.__section = document.getElementById('queues-live')")
    polls.clear()  # from here on the box has the focus

    for n in (2, 3):
        jobs.enqueue("test.echo", {"n": n}, queue="mail")
    assert Job.objects.filter(queue="mail", state="queued").count() == 3  # what a poll would show

    # Two ticks of the poll come and go while the box has the focus: no request, no swap.
    deadline = time.monotonic() + 2 * POLL_SECONDS + MARGIN_SECONDS
    while page.evaluate("window.__waitingTicks") < 2:
        assert not polls, f"the poll requested {polls} while the limit box had the focus"
        assert time.monotonic() < deadline, (
            f"the poll did not tick twice with the box focused in {2 * POLL_SECONDS} s "
            f"(+{MARGIN_SECONDS} s): {page.evaluate('window.__waitingTicks')} tick(s)"
        )
        page.wait_for_timeout(100)  # poll interval of a deadline-bound wait
    assert not polls, f"the poll requested {polls} while the limit box had the focus"
    assert page.evaluate("document.getElementById('queues-live') === window.__section"), (
        "the section was replaced while the limit box had the focus"
    )
    assert page.evaluate("document.activeElement?.name") == "limit", "the box lost the focus"
    assert box.input_value() == "1", "the limit being typed was wiped"
    assert queued.text_content() == "1", "the numbers changed while the box had the focus"

    # Away from the box, the next tick polls again and the new numbers show, without a reload.
    box.blur()
    expect(queued).to_have_text("3", timeout=POLL_MS)
    assert polls, "the numbers changed without a poll request"
    assert page.evaluate("window.__waitingTicks") >= 2, "the page was reloaded, not polled"
    assert page.evaluate("document.getElementById('queues-live') !== window.__section")


def test_the_cron_poll_refreshes_its_numbers_without_a_reload(
    server: str, page_as: Callable[..., Any]
) -> None:
    """The cron page has no box (its forms hold buttons and hidden fields only), so its filter
    never pauses it: this holds only the refresh that the pause would interrupt."""
    schedule = Schedule.objects.create(
        name="digest",
        kind="test.echo",
        cron="*/15 * * * *",
        next_at=datetime.now(UTC) + timedelta(hours=1),
    )
    page = page_as(make_user("reader"))
    polls = htmx_requests(page, "/cron/")
    page.goto(f"{server}/cron/")
    row = page.locator('tr[data-schedule="digest"]')
    expect(row).to_contain_text("0 skipped · 0 enqueued")
    assert page.locator("main input:not([type=hidden])").count() == 0, (
        "the cron page has a box now: test that its poll waits while that box has the focus"
    )
    page.evaluate("window.__section = document.getElementById('cron-live')")
    polls.clear()

    Schedule.objects.filter(pk=schedule.pk).update(ticks_skipped=2, ticks_enqueued=5)
    expect(row).to_contain_text("2 skipped · 5 enqueued", timeout=POLL_MS)
    assert polls, "the numbers changed without a poll request"
    assert page.evaluate("window.__section !== undefined"), "the page was reloaded, not polled"
    assert page.evaluate("document.getElementById('cron-live') !== window.__section")
