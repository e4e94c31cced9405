"""The timeline marks a rescued attempt (its worker process seen dead, the job reclaimed at once:
an `expired` event whose data says `worker_exited`) as "worker process died", not as a lease
that ran out -- and escapes what it shows of it."""

import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from jobs.core.states import JobState
from jobs.models import JobEvent
from jobs.worker import reaper

pytestmark = pytest.mark.django_db

DEAD = "host-a:4242"


def _page(client: Client, job_id: int) -> str:
    response = client.get(reverse("dashboard:job", args=[job_id]))
    assert response.status_code == 200
    return response.content.decode()


def _lanes(html: str) -> str:
    """The timeline's lanes, without its legend (which names every mark)."""
    return html.split('id="timeline"')[1].split('class="legend"')[0]


def test_a_rescued_attempt_is_marked_as_its_worker_process_dying(
    operator_client: Client, make_job: Any
) -> None:
    job = make_job(state=JobState.RUNNING, attempt=1, worker=DEAD)
    assert reaper.rescue(DEAD, time.monotonic(), "rescue:<b>1</b>") == 1
    html = _page(operator_client, job.pk)
    assert 'class="mark mark-worker-exited"' in _lanes(html)
    assert "Worker process died: attempt 1 reclaimed at once by rescue:&lt;b&gt;1&lt;/b&gt;" in html
    assert "<b>1</b>" not in html
    assert "Expired: worker process died" in html  # the bar's own label
    assert "mark-lease-deadline" not in _lanes(html) and "mark-expired" not in _lanes(html)


def test_a_lease_that_ran_out_stays_a_plain_expiry(operator_client: Client, make_job: Any) -> None:
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-5)
    assert reaper.reap("reaper:1") == 1
    html = _lanes(_page(operator_client, job.pk))
    assert 'class="mark mark-expired"' in html and "mark-worker-exited" not in html
    assert "worker process died" not in html


@pytest.mark.parametrize(
    "data",
    ['["worker_exited"]', '"worker_exited"', '{"worker_exited": "true"}', "null", '{"a": 1}'],
)
def test_an_expired_event_that_only_looks_like_a_rescue_is_a_plain_expiry(
    operator_client: Client, make_job: Any, data: str
) -> None:
    job = make_job(state=JobState.RUNNING, attempt=1, lease_in=-5)
    assert reaper.reap("reaper:1") == 1
    with connection.cursor() as cur:  # a raw-SQL row may hold any JSON
        cur.execute("UPDATE jobs_jobevent SET data = %s WHERE type = 'expired'", [data])
    assert JobEvent.objects.filter(job=job, type="expired").exists()
    html = _lanes(_page(operator_client, job.pk))
    assert 'class="mark mark-expired"' in html and "mark-worker-exited" not in html


def test_a_rescued_attempt_is_no_zombie_suspect_on_the_workers_page(
    operator_client: Client, make_job: Any
) -> None:
    """Expired attempts not heard from since are listed as possible zombies; a rescued one's
    worker process is known dead, so it is not one of them. A lease that ran out still is."""
    rescued = make_job(state=JobState.RUNNING, attempt=1, worker=DEAD)
    assert reaper.rescue(DEAD, time.monotonic(), "rescue:1") == 1
    lapsed = make_job(state=JobState.RUNNING, attempt=1, lease_in=-5, worker="host-b:7")
    assert reaper.reap("reaper:1") == 1
    html = operator_client.get(reverse("dashboard:workers")).content.decode()
    suspects = html.split("Expired attempts not heard from since")[1].split("Live workers")[0]
    assert f'href="/jobs/{lapsed.pk}/"' in suspects
    assert f'href="/jobs/{rescued.pk}/"' not in suspects
