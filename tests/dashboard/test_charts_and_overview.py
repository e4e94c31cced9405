"""Charts with axes (dashboard/charts.py) on the overview, its counts linking to the filtered
list, the navigation and help every page carries, and copy-as-JSON on the job page."""

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from dashboard import charts, selectors
from jobs.models import Job

pytestmark = pytest.mark.django_db

MINUTES = [datetime(2026, 12, 1, 14, 0, tzinfo=UTC) + timedelta(minutes=m) for m in range(60)]


@pytest.mark.parametrize(
    "value, top",
    [(0, 4), (0.4, 4), (4, 4), (5, 8), (9, 20), (24, 40), (41, 80), (260, 400), (1000, 1000)],
)
def test_the_value_axis_ends_at_a_round_number_at_or_above_the_largest_value(
    value: float, top: float
) -> None:
    assert charts.nice_max(value) == top


def test_a_chart_has_value_ticks_clock_ticks_every_quarter_hour_and_a_hover_per_minute() -> None:
    values = [0] * 59 + [8]
    chart = charts.Chart("Throughput", "jobs/min", MINUTES, [charts.Series("ok", values, "ok")])
    assert [t.label for t in chart.y_ticks] == ["0", "2", "4", "6", "8"]
    assert [t.label for t in chart.x_ticks] == ["14:14", "14:29", "14:44", "14:59"]
    assert len(chart.columns) == 60
    assert chart.columns[-1].title == "14:59 · ok 8 jobs/min"
    points = chart.lines[0][1].split()
    left, top, right, bottom = chart.plot
    assert points[0] == f"{left:.1f},{bottom:.1f}"  # 0 sits on the time axis
    assert points[-1].startswith(f"{right:.1f},")  # the current minute at the right edge


def test_a_percentage_chart_keeps_its_axis_at_100() -> None:
    chart = charts.Chart(
        "Failure rate", "%", MINUTES, [charts.Series("failed", [5.0] * 60, "bad")], fixed_max=100
    )
    assert chart.y_ticks[-1].label == "100"


def test_the_overview_draws_charts_with_axes_not_bare_sparklines(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    for chart_id in ("chart-finished", "chart-rejected"):
        figure = html[html.index(f'id="{chart_id}"') :]
        figure = figure[: figure.index("</figure>")]
        assert 'class="axis axis-y"' in figure and 'class="axis axis-x"' in figure
        assert figure.count("<rect ") == 30 and "/min</text>" in figure


def test_the_overview_counts_link_to_the_filtered_jobs_list(
    operator_client: Client, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selectors, "_terminal", None)  # finished counts are cached for 10 s
    make_job(queue="mail", state="failed", attempt=1)
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    jobs = reverse("dashboard:jobs")
    assert f'<a href="{jobs}?queue=mail&amp;state=failed">1</a>' in html
    assert f'href="{jobs}?state=failed"' in html


def test_every_page_links_the_queues_and_cron_pages_and_the_shortcut_help(
    operator_client: Client,
) -> None:
    html = operator_client.get(reverse("dashboard:workers")).content.decode()
    assert f'href="{reverse("dashboard:queues")}"' in html
    assert f'href="{reverse("dashboard:cron")}"' in html
    assert '<dialog id="shortcuts"' in html and "/static/dashboard/keys.js" in html
    assert '<meta name="color-scheme" content="light dark">' in html


def test_the_job_page_offers_copy_as_json_for_payload_and_result(
    operator_client: Client, make_job: Callable[..., Job]
) -> None:
    job = make_job(state="succeeded", attempt=1, payload={"order": 7}, result={"pages": 3})
    html = operator_client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    assert 'data-copy="payload"' in html and 'data-copy="result"' in html
    assert 'id="result"' in html


def _events(job: Job, type_: str, n: int, minutes_ago: int) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data) "
            "SELECT %s, 1, %s, 'w', clock_timestamp() - make_interval(mins => %s), '{}' "
            "FROM generate_series(1, %s)",
            [job.pk, type_, minutes_ago, n],
        )


def test_the_overview_says_when_its_charts_reach_back_less_than_their_minutes(
    operator_client: Client, make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The charts count the newest HISTORY_EVENTS events (a bound on what one refresh reads):
    # under a stream those reach back seconds, and the page says from when, not a silent zero.
    monkeypatch.setattr(selectors, "HISTORY_EVENTS", 50)
    job = make_job(state="succeeded", attempt=1)
    _events(job, "succeeded", 20, minutes_ago=10)
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    assert 'id="history-since"' not in html  # 20 events: the window holds all 30 minutes
    _events(job, "claimed", 60, minutes_ago=1)
    overview = selectors.overview()
    assert overview.history_since is not None
    assert overview.history_since > datetime.now(UTC) - timedelta(minutes=2)
    assert sum(overview.succeeded_per_min) == 0  # the ten-minute-old successes are past it
    html = operator_client.get(reverse("dashboard:overview")).content.decode()
    assert 'id="history-since"' in html and "The charts count the newest 50 events" in html


def test_ids_burnt_by_rolled_back_inserts_are_not_taken_for_events_left_out(
    make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rolled-back insert still takes its id, so the newest HISTORY_EVENTS ids can reach below
    # the oldest event there is. The page said the charts reached back only to that event (ten
    # minutes) when no event had been left out.
    from django.db import connection, transaction

    monkeypatch.setattr(selectors, "HISTORY_EVENTS", 50)
    try:  # ids burnt the way an application burns them: a rolled-back transaction
        with transaction.atomic():
            job = make_job(state="succeeded", attempt=1)
            _events(job, "claimed", 5, minutes_ago=1)
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    with connection.cursor() as cur:
        cur.execute(
            "SELECT nextval(pg_get_serial_sequence('jobs_jobevent', 'id')) "
            "FROM generate_series(1, 200)"
        )
    job = make_job(state="succeeded", attempt=1)
    _events(job, "succeeded", 20, minutes_ago=10)
    overview = selectors.overview()
    assert overview.history_since is None
    assert sum(overview.succeeded_per_min) == 20
    # One event the window leaves out, inside the charts' minutes: the note is back.
    _events(job, "claimed", 50, minutes_ago=1)
    overview = selectors.overview()
    assert overview.history_since is not None
    assert sum(overview.succeeded_per_min) == 0


def test_the_overview_lists_the_busiest_queues_and_counts_the_rest(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every queue name a job ever carried was a row of the overview, pushed to every open one
    once a second (3,000 queues: 1.3 MB a push). Now OVERVIEW_QUEUES of them, the most queued
    and running first, and the rest counted; the state totals still count every queue."""
    cap = 100  # selectors.OVERVIEW_QUEUES
    monkeypatch.setattr(selectors, "_terminal", None)  # finished counts are cached for 10 s
    tenants = 2 * cap
    done = {"state": "succeeded", "finished_at": datetime.now(UTC)}
    Job.objects.bulk_create(  # each old queue has more jobs in all than "live" ...
        [Job(kind="demo.noop", queue=f"old-{i:04}", **done) for i in range(tenants) for _ in "ab"]
    )
    Job.objects.create(kind="demo.noop", queue="live")  # ... which has the one queued
    html = operator_client.get("/", HTTP_HX_REQUEST="true").content.decode()
    shown = re.findall(r'<tr data-queue="([^"]+)"', html)
    assert len(shown) == cap
    assert "live" in shown
    assert f"{tenants + 1 - cap} more queues not shown" in html
    assert re.search(r'data-count="succeeded">\s*' + str(2 * tenants) + r"<", html)
    assert selectors.OVERVIEW_QUEUES == cap


@pytest.mark.parametrize("name", ["items", "keys", "values"])
def test_a_queue_named_after_a_dict_method_is_a_row_of_the_overview(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The table looped over `o.by_queue.items`, which a template reads as the key "items"
    first: a queue of that name (a valid one) made the overview a 500, for every viewer and
    every push. Found in second review."""
    monkeypatch.setattr(selectors, "_terminal", None)
    Job.objects.bulk_create([Job(kind="demo.noop", queue=q) for q in (name, "other")])
    response = operator_client.get("/", HTTP_HX_REQUEST="true")
    shown = re.findall(r'<tr data-queue="([^"]+)"', response.content.decode())
    assert response.status_code == 200 and sorted(shown) == sorted([name, "other"])


def test_queued_and_running_counts_are_exact_at_once_finished_ones_kept_for_a_while(
    monkeypatch: pytest.MonkeyPatch, make_job: Callable[..., Job]
) -> None:
    """Counting finished jobs walks the table: each process keeps that count for 10 s. The
    queued and running counts are read afresh at every refresh."""
    monkeypatch.setattr(selectors, "_terminal", None)
    assert selectors.overview().by_state == {}
    make_job()
    make_job(state="running", attempt=1)
    Job.objects.create(kind="demo.noop", state="succeeded", finished_at=datetime.now(UTC))
    counts = selectors.overview().by_state
    assert counts.get("queued") == 1 and counts.get("running") == 1
    assert "succeeded" not in counts  # the kept count, until it is taken again
    monkeypatch.setattr(selectors, "_terminal", None)
    assert selectors.overview().by_state.get("succeeded") == 1


def test_the_oldest_due_card_is_the_job_due_longest(make_job: Callable[..., Job]) -> None:
    now = datetime.now(UTC)
    for minutes in (-1, -10, 30):  # due a minute ago, due ten minutes ago, and not yet due
        make_job(run_at=now + timedelta(minutes=minutes))
    oldest = selectors.overview().oldest_queued
    assert oldest is not None and abs(oldest - (now - timedelta(minutes=10))) < timedelta(seconds=1)
