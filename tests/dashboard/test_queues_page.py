"""The queues page: its numbers against real rows, its charts, who may see it, and escaping."""

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard import queues
from jobs.models import Job
from jobs.ops import queues as queue_ops
from tests.dashboard.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_settled_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no per-minute counts remembered from another test's rows."""
    monkeypatch.setattr(queues, "_settled", {})


def _finished(job: Job, minutes_ago: float) -> None:
    """Move a finished job's finished_at back (plain SQL, as a test plants history)."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET finished_at = clock_timestamp() - make_interval(secs => %s) "
            "WHERE id = %s",
            [minutes_ago * 60, job.pk],
        )


def _row(html: str, queue: str) -> str:
    match = re.search(
        rf'<tr class="queue[^"]*" data-queue="{re.escape(queue)}".*?</tr>', html, re.S
    )
    assert match, f"no row for {queue!r}"
    return match.group(0)


def _cell(row: str, name: str) -> str:
    match = re.search(rf'<td data-n="{name}">(.*?)</td>', row, re.S)
    assert match, name
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


def test_the_queues_page_counts_real_rows_per_queue(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    now = timezone.now()
    for _ in range(3):
        make_job(queue="mail", run_at=now - timedelta(minutes=5))  # due
    make_job(queue="mail", run_at=now + timedelta(hours=1))  # scheduled
    make_job(queue="mail", state="running", attempt=1)
    make_job(queue="mail", state="running", attempt=1)
    for _ in range(2):
        make_job(queue="mail", state="failed", attempt=1)  # in the last hour
    old = make_job(queue="mail", state="failed", attempt=1)
    _finished(old, 90)  # an hour and a half ago: not counted
    make_job(queue="mail", state="succeeded", attempt=1)
    make_job(queue="reports", run_at=now - timedelta(seconds=30))
    make_job(queue="later", run_at=now + timedelta(hours=2))  # scheduled only: nothing due

    html = operator_client.get(reverse("dashboard:queues")).content.decode()

    mail = _row(html, "mail")
    assert [_cell(mail, n) for n in ("queued", "due", "scheduled", "failed", "succeeded")] == [
        "4",
        "3",
        "1",
        "2",
        "1",
    ]
    assert _cell(mail, "running").startswith("2 /")
    assert "min" in _cell(mail, "oldest")  # the oldest due job has waited about 5 minutes
    reports = _row(html, "reports")
    assert (_cell(reports, "queued"), _cell(reports, "running")[:1]) == ("1", "0")
    later = _row(html, "later")
    assert [_cell(later, n) for n in ("due", "scheduled", "oldest")] == ["0", "1", "–"]


def test_counts_link_to_the_filtered_jobs_list(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    make_job(queue="mail", state="failed", attempt=1)
    html = operator_client.get(reverse("dashboard:queues")).content.decode()
    assert f'href="{reverse("dashboard:jobs")}?queue=mail&amp;state=failed"' in html
    assert f'href="{reverse("dashboard:jobs")}?queue=mail&amp;state=queued"' in html


def test_throughput_and_failure_rate_are_charts_with_axes_units_and_hover_values(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    for _ in range(3):
        make_job(queue="mail", state="succeeded", attempt=1)
    make_job(queue="mail", state="failed", attempt=1)
    with connection.cursor() as cur:  # all four in one minute, even if the test straddles two
        cur.execute(
            "UPDATE jobs_job SET finished_at = date_trunc('minute', clock_timestamp()) "
            "WHERE finished_at IS NOT NULL"
        )
    html = operator_client.get(reverse("dashboard:queues")).content.decode()

    throughput = html[html.index('id="throughput-mail"') :]
    throughput = throughput[: throughput.index("</figure>")]
    assert 'class="axis axis-y"' in throughput and 'class="axis axis-x"' in throughput
    assert ">jobs/min</text>" in throughput
    assert throughput.count("<rect ") == queues.HOUR_MINUTES  # one hover column per minute
    assert "succeeded 3 jobs/min, failed 1 jobs/min</title>" in throughput
    rate = html[html.index('id="failure-rate-mail"') :]
    rate = rate[: rate.index("</figure>")]
    assert ">%</text>" in rate and ">100</text>" in rate  # a percentage axis up to 100
    assert "failed 25 %</title>" in rate


def test_the_last_hour_query_reads_the_finished_index_only(make_job: Callable[..., Job]) -> None:
    make_job(queue="mail", state="succeeded", attempt=1)
    # As a live table is: most jobs finished long before the hour, and statistics that say so
    # (a near-empty table's left the planner free to walk any index, by the order tests ran in).
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_job (kind, queue, state, attempt, finished_at) "
            "SELECT 'test.echo', 'mail', 'succeeded', 1, "
            "clock_timestamp() - interval '2 days' - n * interval '1 second' "
            "FROM generate_series(1, 2000) n"
        )
        cur.execute("ANALYZE jobs_job")
    qs = Job.objects.filter(finished_at__gte=timezone.now() - timedelta(hours=1))
    sql, params = (
        qs.values("queue", "state").annotate(n=queues.Count("*")).order_by().query.sql_with_params()
    )
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(r[0] for r in cur.fetchall())
    assert "jobs_job_finished_idx" in plan, plan


def test_a_hostile_queue_name_renders_as_text(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    hostile = '<script>alert("q")</script>'
    make_job(queue=hostile, state="failed", attempt=1)
    html = operator_client.get(reverse("dashboard:queues")).content.decode()
    assert hostile not in html
    assert "&lt;script&gt;alert(&quot;q&quot;)&lt;/script&gt;" in html


def test_the_queues_page_needs_login_and_the_view_permission(
    client: Client, make_job: Callable[..., Job], outsider
) -> None:
    url = reverse("dashboard:queues")
    response = client.get(url)
    assert response.status_code == 302 and reverse("dashboard:login") in response["Location"]
    client.force_login(outsider)
    assert client.get(url).status_code == 403


def test_an_htmx_poll_gets_only_the_queues_partial(operator_client: Client) -> None:
    html = operator_client.get(
        reverse("dashboard:queues"), headers={"HX-Request": "true"}
    ).content.decode()
    assert html.lstrip().startswith('<section id="queues-live"') and "<html" not in html


def test_failure_rate_is_failed_over_finished_per_minute() -> None:
    assert queues.failure_rate([3, 0, 0], [1, 0, 2]) == [25.0, 0.0, 100.0]


@pytest.fixture
def queue_operator(staff: User) -> User:
    """Staff with the dashboard's permissions and jobs.change_job (what jobs.ops.queues asks)."""
    staff.user_permissions.add(
        Permission.objects.get(codename="change_job", content_type__app_label="jobs")
    )
    return User.objects.get(pk=staff.pk)  # permissions are cached per instance


def test_staff_pauses_limits_and_resumes_a_queue_from_the_page_audited(
    queue_operator: User, make_job: Callable[..., Job]
) -> None:
    make_job(queue="mail")
    client = client_for(queue_operator)
    url = reverse("dashboard:queue-action")
    page = client.post(url, {"name": "mail", "action": "pause"}, follow=True).content.decode()
    assert "queue mail: paused." in page
    assert 'class="badge alarm">paused<' in _row(page, "mail")
    page = client.post(
        url, {"name": "mail", "action": "limit", "limit": "3"}, follow=True
    ).content.decode()
    assert '<span class="limit">3</span>' in _row(page, "mail")
    client.post(url, {"name": "mail", "action": "resume"})
    assert queue_ops.controls()["mail"] == queue_ops.QueueControl(paused=False, limit=3)
    client.post(url, {"name": "mail", "action": "limit", "limit": ""})
    assert "mail" not in queue_ops.controls()
    audit = list(LogEntry.objects.order_by("id").values_list("change_message", flat=True))
    assert audit == [
        "paused",
        "concurrency limit none -> 3",
        "resumed",
        "concurrency limit 3 -> none",
    ]


@pytest.mark.parametrize("limit", ["abc", "0", "-1", "1e3", "100001"])
def test_a_bad_limit_is_refused_with_the_reason_and_writes_nothing(
    queue_operator: User, limit: str
) -> None:
    page = client_for(queue_operator).post(
        reverse("dashboard:queue-action"),
        {"name": "mail", "action": "limit", "limit": limit},
        follow=True,
    )
    assert "concurrency limit is a whole number" in page.content.decode()
    assert queue_ops.controls() == {} and not LogEntry.objects.exists()


def test_a_hostile_queue_name_is_refused_by_the_controls(queue_operator: User) -> None:
    page = client_for(queue_operator).post(
        reverse("dashboard:queue-action"),
        {"name": "<b>x</b>", "action": "pause"},
        follow=True,
    )
    html = page.content.decode()
    assert "is not a queue name" in html and "<b>x</b>" not in html
    assert queue_ops.controls() == {}


def test_a_viewer_sees_no_controls_and_may_not_pause(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    make_job(queue="mail")
    assert "Pause" not in operator_client.get(reverse("dashboard:queues")).content.decode()
    response = operator_client.post(
        reverse("dashboard:queue-action"), {"name": "mail", "action": "pause"}
    )
    assert response.status_code == 403 and queue_ops.controls() == {}


def test_a_user_who_is_not_staff_sees_no_controls_and_may_not_press_even_with_change_job(
    unstaffed: User, make_job: Callable[..., Job]
) -> None:
    make_job(queue="mail")
    client = client_for(unstaffed)
    html = client.get(reverse("dashboard:queues")).content.decode()
    assert "Pause" not in html and reverse("dashboard:queue-action") not in html
    for fields in ({"action": "pause"}, {"action": "resume"}, {"action": "limit", "limit": "3"}):
        response = client.post(reverse("dashboard:queue-action"), {"name": "mail", **fields})
        assert response.status_code == 403, fields
    assert queue_ops.controls() == {} and not LogEntry.objects.exists()


def test_staff_without_the_job_change_permission_may_not_pause(staff_client: Client) -> None:
    response = staff_client.post(
        reverse("dashboard:queue-action"), {"name": "mail", "action": "pause"}
    )
    assert response.status_code == 403 and queue_ops.controls() == {}


def test_pausing_needs_the_csrf_token(queue_operator: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(queue_operator)
    response = client.post(reverse("dashboard:queue-action"), {"name": "mail", "action": "pause"})
    assert response.status_code == 403 and queue_ops.controls() == {}


def test_a_paused_queue_without_jobs_is_listed(queue_operator: User) -> None:
    queue_ops.pause("idle", actor=queue_operator)
    html = client_for(queue_operator).get(reverse("dashboard:queues")).content.decode()
    assert 'class="badge alarm">paused<' in _row(html, "idle")


def test_settled_minutes_are_read_once_per_process_and_the_last_two_minutes_every_time(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    _finished(make_job(queue="mail", state="failed", attempt=1), 10)
    url = reverse("dashboard:queues")
    assert _cell(_row(operator_client.get(url).content.decode(), "mail"), "failed") == "1"
    _finished(make_job(queue="mail", state="failed", attempt=1), 10)  # behind the page's back
    make_job(queue="mail", state="failed", attempt=1)  # finished now
    long_ago = datetime(2000, 1, 1, tzinfo=UTC)
    queues._settled[long_ago] = [{"queue": "mail", "state": "failed", "minute": long_ago, "n": 9}]
    html = operator_client.get(url).content.decode()
    assert _cell(_row(html, "mail"), "failed") == "2"  # the settled minute is not read again
    assert long_ago not in queues._settled  # a minute that left the hour is forgotten


@pytest.mark.parametrize("field", ["name", "action"])
def test_an_overlong_name_or_action_comes_back_cut_in_the_message(
    queue_operator: User, field: str
) -> None:
    """Before: a 100 KB queue name or action came back whole in the error message, stored in
    the session (too large for the messages cookie) and printed on the next page."""
    client = client_for(queue_operator)
    sent = {"name": "mail", "action": "pause", field: "zq" * 50_000}
    response = client.post(reverse("dashboard:queue-action"), sent, follow=True)
    html = response.content.decode()
    assert response.status_code == 200 and "zqzq" in html and "zq" * 100 not in html
    assert queue_ops.controls() == {}


def test_a_page_of_many_queues_draws_the_busiest_and_the_paused_and_counts_the_rest(
    operator_client: Client,
) -> None:
    """A queue is whatever name producers enqueue into (one per tenant): every one of them was
    a row with two charts, and 1,000 queues made each 5-second poll 19 MB and 5 s of rendering.
    Now the page draws MAX_QUEUES of them -- the controlled ones and the busiest -- and counts
    the rest."""
    cap = 100  # queues.MAX_QUEUES
    tenants = 3 * cap
    Job.objects.bulk_create([Job(kind="demo.noop", queue=f"tenant-{i:04}") for i in range(tenants)])
    Job.objects.bulk_create([Job(kind="demo.noop", queue="busy") for _ in range(5)])
    queue_ops.pause("tenant-0299", actor=None)  # as quiet as the others, but an operator paused it
    response = operator_client.get(reverse("dashboard:queues"), HTTP_HX_REQUEST="true")
    html = response.content.decode()
    shown = re.findall(r'<tr class="queue[^"]*" data-queue="([^"]+)"', html)
    assert len(shown) == cap
    assert "busy" in shown and "tenant-0299" in shown
    assert shown == sorted(shown)
    assert html.count('class="queue-charts"') == cap
    more = tenants + 1 - cap
    assert f"{more} more queues not shown" in html
    assert len(response.content) < 4_000_000
    assert queues.MAX_QUEUES == cap


def test_a_paused_queue_is_drawn_before_a_hundred_limited_ones(operator_client: Client) -> None:
    """A limit per tenant's queue is the common case; pausing one more tenant then hid it: the
    controlled queues were ranked busiest first, limited or paused alike, and a paused queue has
    nothing running, so its Resume button was off the page. Found in second review."""
    cap = queues.MAX_QUEUES
    names = [f"tenant-{i:04}" for i in range(cap)]
    Job.objects.bulk_create([Job(kind="demo.noop", queue=name) for name in names])
    for name in names:
        queue_ops.set_limit(name, 5, actor=None)
    queue_ops.pause("zz-paused", actor=None)
    response = operator_client.get(reverse("dashboard:queues"), HTTP_HX_REQUEST="true")
    html = response.content.decode()
    shown = re.findall(r'<tr class="queue[^"]*" data-queue="([^"]+)"', html)
    assert len(shown) == cap and "zz-paused" in shown
    assert "1 more queue not shown" in html
