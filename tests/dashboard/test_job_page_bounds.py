"""The job page of a long job stays bounded: heartbeats arrive binned by the database, the event
log shows the newest LOG_ROWS with "older" pages, and the number of queries does not grow with
the events (docs/dashboard.md, "the dashboard at a million jobs")."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from dashboard import selectors, timeline
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from tests.dashboard.conftest import client_for

pytestmark = pytest.mark.django_db


def long_job(make_job, attempts: int = 5, beats: int = 600) -> Job:  # type: ignore[no-untyped-def]
    """`attempts` attempts of 10 s each, `beats` heartbeats spread over them, and their claims
    and expiries: the shape bench/dashboard.py seeds (50 attempts, 5,000 events) in small."""
    job = make_job(state="succeeded", attempt=attempts)
    t0 = timezone.now() - timedelta(seconds=attempts * 10 + 5)
    Attempt.objects.bulk_create(
        Attempt(
            job=job,
            number=n,
            worker=f"host:{n}",
            claimed_at=t0 + timedelta(seconds=(n - 1) * 10),
            heartbeat_at=t0 + timedelta(seconds=(n - 1) * 10 + 9),
            ended_at=t0 + timedelta(seconds=n * 10 - 0.5),
            outcome="succeeded" if n == attempts else "expired",
        )
        for n in range(1, attempts + 1)
    )
    events = []
    per = beats // attempts
    for n in range(1, attempts + 1):
        start = t0 + timedelta(seconds=(n - 1) * 10)
        events.append(JobEvent(job=job, attempt=n, type="claimed", worker="w", at=start, data={}))
        events += [
            JobEvent(
                job=job,
                attempt=n,
                type="heartbeat",
                worker="w",
                at=start + timedelta(seconds=9 * (i + 1) / per),
                data={},
            )
            for i in range(per)
        ]
        end = "succeeded" if n == attempts else "expired"
        events.append(
            JobEvent(
                job=job, attempt=n, type=end, worker="w", at=start + timedelta(seconds=9.5), data={}
            )
        )
    JobEvent.objects.bulk_create(events)
    return job


def test_heartbeats_arrive_binned_and_draw_the_same_timeline(make_job) -> None:  # type: ignore[no-untyped-def]
    job = long_job(make_job, attempts=5, beats=3000)
    now = timezone.now()
    detail = selectors.job_detail(job.pk, now)
    assert detail is not None
    assert len(detail.minor) <= 5 * 101  # bins (attempt, type, percent), not 3,000 rows
    assert sum(n for *_, n in detail.minor) == 3000
    assert detail.events_total == 3000 + 10
    binned = timeline.build(
        detail.job, detail.attempts, detail.events, detail.rejected, now, minor=detail.minor
    )
    raw = list(
        JobEvent.objects.filter(job=job, type="heartbeat")
        .order_by("-id")
        .values_list("attempt", "type", "at")
    )
    unbinned = timeline.build(
        detail.job, detail.attempts, detail.events, detail.rejected, now, minor=raw
    )
    assert binned is not None and unbinned is not None
    assert (binned.start, binned.end) == (unbinned.start, unbinned.end)
    for a, b in zip(binned.bars, unbinned.bars, strict=True):  # the same heartbeats per bar
        assert sum(m.count for m in a.markers if m.kind == "heartbeat") == sum(
            m.count for m in b.markers if m.kind == "heartbeat"
        )
        assert [m.kind for m in a.markers if m.kind != "heartbeat"] == [
            m.kind for m in b.markers if m.kind != "heartbeat"
        ]


def test_the_job_page_makes_as_many_queries_for_3000_events_as_for_30(
    operator_client: Client, make_job
) -> None:  # type: ignore[no-untyped-def]
    counts = []
    for beats in (25, 3000):
        job = long_job(make_job, attempts=5, beats=beats)
        url = reverse("dashboard:job", args=[job.pk])
        operator_client.get(url)
        with CaptureQueriesContext(connection) as ran:
            html = operator_client.get(url).content.decode()
        counts.append(len(ran.captured_queries))
        assert html.count('class="lane"') == 5
    assert counts[0] == counts[1], counts


def test_the_event_log_shows_the_newest_and_pages_to_every_older_event(
    operator_client: Client, make_job
) -> None:  # type: ignore[no-untyped-def]
    job = long_job(make_job, attempts=3, beats=240)  # 246 events
    every = list(JobEvent.objects.filter(job=job).order_by("-id").values_list("pk", flat=True))
    page = operator_client.get(reverse("dashboard:job", args=[job.pk]))
    shown = [e.pk for e in page.context["detail"].log]
    assert shown == every[: selectors.LOG_ROWS][::-1]
    html = page.content.decode()
    assert f"Showing the newest {selectors.LOG_ROWS} of {len(every)} events" in html
    link = html.split('id="older-events"')[0].rsplit('href="', 1)[1].split('"')[0]
    assert link.endswith(f"?before={shown[0]}")
    found, pages = [], 0
    while link and pages < 10:
        response = operator_client.get(link.replace("&amp;", "&"))
        assert response.status_code == 200
        found += [e.pk for e in response.context["page"].events]
        nxt = response.context["page"].next_before
        link = f"{reverse('dashboard:job-events', args=[job.pk])}?before={nxt}" if nxt else ""
        pages += 1
    assert found == every[selectors.LOG_ROWS :]  # each older event once, newest first
    assert pages == 2  # 196 older events, 100 a page


def test_the_events_page_refuses_a_bad_cursor_and_a_missing_job(
    operator_client: Client, outsider: User, make_job
) -> None:  # type: ignore[no-untyped-def]
    job = long_job(make_job, attempts=1, beats=5)
    url = reverse("dashboard:job-events", args=[job.pk])
    assert operator_client.get(url, {"before": "7; drop"}).status_code == 400
    assert operator_client.get(url, {"before": "9" * 19}).status_code == 400
    assert operator_client.get(reverse("dashboard:job-events", args=[10**12])).status_code == 404
    assert client_for(outsider).get(url).status_code == 403
    assert Client().get(url).status_code == 302  # to the login page


def test_the_events_page_escapes_what_workers_wrote(operator_client: Client, make_job) -> None:  # type: ignore[no-untyped-def]
    job = long_job(make_job, attempts=1, beats=5)
    JobEvent.objects.create(
        job=job, attempt=1, type="<b>odd</b>", worker="<script>x()</script>", data={"a": "<i>"}
    )
    html = operator_client.get(reverse("dashboard:job-events", args=[job.pk])).content.decode()
    assert "<script>x()" not in html and "&lt;script&gt;x()" in html
    assert "<b>odd" not in html and "<i>" not in html


def test_the_timeline_escapes_worker_names_and_event_types(
    operator_client: Client, make_job
) -> None:  # type: ignore[no-untyped-def]
    """The lanes and marks are built by a template tag, not the template: still escaped."""
    job = long_job(make_job, attempts=2, beats=10)
    Attempt.objects.filter(job=job, number=1).update(worker='<script>lane()</script>"')
    JobEvent.objects.filter(job=job, type="claimed").update(
        worker='x" onmouseover="mark()', type='claimed"><i>'
    )
    html = operator_client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    timeline_html = html[html.index('id="timeline"') : html.index('<p class="legend">')]
    assert "<script>lane()" not in html and "&lt;script&gt;lane()&lt;/script&gt;&quot;" in html
    assert 'onmouseover="mark()' not in timeline_html and "x&quot; onmouseover=" in timeline_html
    assert "<i>" not in timeline_html and "mark-claimed&quot;&gt;&lt;i&gt;" in timeline_html


def test_a_job_with_times_at_the_ends_of_the_calendar_still_opens(operator_client: Client) -> None:
    """Rows written by hand (SQL, a restore) can hold any timestamp PostgreSQL takes: the axis
    ends at the last instant a datetime holds instead of overflowing past the year 9999."""
    first, last = datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    job = Job.objects.create(
        kind="test.echo", state="running", attempt=2, lease_expires_at=last, heartbeat_at=first
    )
    Attempt.objects.create(
        job=job, number=1, worker="w", claimed_at=last, ended_at=first, outcome="expired",
        heartbeat_at=last,
    )  # fmt: skip
    Attempt.objects.create(job=job, number=2, worker="w", claimed_at=first, heartbeat_at=last)
    for type_, when in [("claimed", first), ("expired", last), ("heartbeat", last)]:
        JobEvent.objects.create(job=job, attempt=1, type=type_, worker="w", at=when)
    RejectedWrite.objects.create(
        job=job, attempt_presented=1, attempt_current=2, state_current="running", worker="w",
        write="commit", at=first,
    )  # fmt: skip
    response = operator_client.get(reverse("dashboard:job", args=[job.pk]))
    assert response.status_code == 200
    assert 'id="timeline"' in response.content.decode()


def _many_attempts_and_rejections(make_job, n: int) -> Job:  # type: ignore[no-untyped-def]
    job = make_job(state="running", attempt=n, worker=f"w:{n}")
    now = timezone.now()
    Attempt.objects.bulk_create(
        Attempt(job=job, number=i, worker=f"w:{i}", claimed_at=now, outcome="expired")
        for i in range(1, n)
    )
    JobEvent.objects.bulk_create(
        JobEvent(job=job, attempt=i, type="claimed", worker=f"w:{i}") for i in range(1, n + 1)
    )
    RejectedWrite.objects.bulk_create(
        RejectedWrite(
            job=job,
            attempt_presented=i,
            attempt_current=n,
            state_current="running",
            worker=f"zombie:{i}",
            write="heartbeat",
        )  # fmt: skip
        for i in range(1, n + 1)
    )
    return job


def test_a_job_with_many_attempts_and_rejections_shows_the_newest_and_says_so(
    make_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every attempt, boundary event and rejected write was drawn and listed (3,000
    attempts and 5,000 rejected writes: a 3.7 MB page in 3.5 s)."""
    monkeypatch.setattr(selectors, "ATTEMPT_ROWS", 5)
    monkeypatch.setattr(selectors, "REJECTED_ROWS", 4)
    job = _many_attempts_and_rejections(make_job, 12)
    detail = selectors.job_detail(job.pk)
    assert detail is not None
    assert [a.number for a in detail.attempts] == [8, 9, 10, 11, 12]
    assert {e.attempt for e in detail.events} <= {0, 8, 9, 10, 11, 12}
    assert [r.worker for r in detail.rejected] == [f"zombie:{i}" for i in range(9, 13)]
    assert (detail.attempts_total, detail.rejected_total) == (12, 12)
    html = (
        client_for(User.objects.create_superuser("root", password="pw"))
        .get(reverse("dashboard:job", args=[job.pk]))
        .content.decode()
    )
    assert "The newest 5 of 12 attempts" in html and "The newest 4 of 12 rejected writes" in html
    assert "zombie:8<" not in html and "zombie:9<" in html
