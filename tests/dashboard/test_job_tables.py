"""The job page's attempts, rejected-writes and event-log tables, built row by row in Python
(dashboard_tags.attempt_rows / rejected_rows / event_rows): every value escaped, the markup and
the labels the template printed."""

import re
from html import escape
from typing import Any

import pytest
from django.db import connection
from django.db.models import Model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard.selectors import EVENT_DATA_CHARS
from jobs.models import Attempt, Job, JobEvent, RejectedWrite

pytestmark = pytest.mark.django_db

HOSTILE = '<img src=x onerror="window.pwned=1">'


def rows(html: str, table_id: str) -> list[str]:
    body = re.search(table_id + r".*?<tbody>(.*?)</tbody>", html, re.S)
    assert body, f"no {table_id} table"
    return re.findall(r"<tr[ >].*?</tr>", body.group(1), re.S)


def test_the_job_tables_escape_every_value_and_keep_their_markup(operator_client: Client) -> None:
    now = timezone.now()
    job = Job.objects.create(kind="test.echo", state="failed", attempt=2, finished_at=now)
    long_error = HOSTILE + "x" * 200
    Attempt.objects.create(
        job=job, number=1, worker=HOSTILE, claimed_at=now, ended_at=now, outcome="expired",
        error=long_error,
    )  # fmt: skip
    Attempt.objects.create(job=job, number=2, worker="w:2", claimed_at=now, outcome="failed")
    RejectedWrite.objects.create(
        job=job, attempt_presented=1, attempt_current=2, state_current="running",
        worker=HOSTILE, write="commit", resource=HOSTILE,
    )  # fmt: skip
    RejectedWrite.objects.create(
        job=job, attempt_presented=1, attempt_current=2, state_current="failed", worker="w:1",
        write="heartbeat",
    )  # fmt: skip
    JobEvent.objects.create(job=job, attempt=1, type="claimed", worker=HOSTILE, data={"x": HOSTILE})

    html = operator_client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    assert HOSTILE not in html and "onerror=&quot;" in html

    first, second = rows(html, "<h2>Attempts</h2>")
    assert 'class="outcome-expired"' in first and "<td>1</td>" in first
    assert "&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;" in first  # the worker
    summary = re.search(r"<summary>(.*?)</summary>", first, re.S)
    assert summary and summary.group(1).endswith("…") and "x" * 100 not in summary.group(1)
    assert '<pre class="error">' in first and "x" * 200 in first  # the whole error
    assert "<details>" not in second and "Failed" in second  # the outcome's label

    shown, plain = rows(html, 'id="job-rejected"')
    assert shown.count("&lt;img") == 2 and "Commit" in shown and "Running" in shown
    assert "<td>job row</td>" in plain and "Heartbeat" in plain

    (event,) = rows(html, 'class="grid events"')
    assert 'class="ev-claimed"' in event and "&lt;img" in event
    assert "{&quot;x&quot;: &quot;&lt;img" in event  # the data as the database gives its text


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (Job, "state"),
        (Attempt, "outcome"),
        (JobEvent, "type"),
        (RejectedWrite, "write"),
        (RejectedWrite, "state_current"),
    ],
)
def test_display_gives_what_get_foo_display_gives(model: type[Model], field: str) -> None:
    from dashboard.timeline import display

    choices: Any = model._meta.get_field(field)
    values = [value for value, _ in choices.flatchoices]
    for value in [*values, "not-a-choice"]:
        obj = model(**{field: value})
        assert display(obj, field) == getattr(obj, f"get_{field}_display")()


NESTED = "[" * 5000 + "]" * 5000  # valid jsonb, beyond Python's recursion limit
HUGE_NUMBER = '{"n": 1e5000}'  # jsonb keeps every digit; Python refuses an int of over 4,300


@pytest.mark.parametrize("data", [NESTED, HUGE_NUMBER], ids=["nested", "huge-number"])
def test_an_event_python_cannot_decode_is_shown_as_its_text(
    operator_client: Client, make_job: Any, data: str
) -> None:
    """Before: one raw-SQL event like this made its job's page and events pages a 500."""
    job = make_job(state="running", attempt=1)
    event = JobEvent.objects.create(job=job, attempt=1, type="claimed", worker="w:1")
    JobEvent.objects.create(job=job, attempt=1, type="heartbeat", worker="w:1")
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_jobevent SET data = %s::jsonb WHERE id = %s RETURNING data::text",
            [data, event.pk],
        )
        stored = cur.fetchone()[0]
    for url in (reverse("dashboard:job", args=[job.pk]), f"/jobs/{job.pk}/events/"):
        response = operator_client.get(url)
        assert response.status_code == 200, url
        assert escape(stored[:50]) in response.content.decode()


def test_a_huge_event_data_is_cut_in_the_log(operator_client: Client, make_job: Any) -> None:
    """Before: an event holding 5 MB of data made its job's page 5 MB."""
    job = make_job(state="running", attempt=1)
    JobEvent.objects.create(job=job, attempt=1, type="claimed", data={"s": "z" * 5_000_000})
    for url in (reverse("dashboard:job", args=[job.pk]), f"/jobs/{job.pk}/events/"):
        html = operator_client.get(url).content.decode()
        assert f"(the first {EVENT_DATA_CHARS:,} characters)" in html and len(html) < 100_000
