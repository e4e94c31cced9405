"""The queues and cron pages open on the embedded SQLite of bin/run, with their numbers."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

import jobs
from jobs.models import Schedule

pytestmark = pytest.mark.django_db


def test_the_queues_cron_and_overview_pages_open_on_sqlite() -> None:
    jobs.enqueue("test.echo", {"n": 1}, queue="mail")
    Schedule.objects.create(
        name="digest", kind="test.echo", cron="*/15 * * * *", next_at="2030-01-01T00:00Z"
    )
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    queues = client.get(reverse("dashboard:queues")).content.decode()
    assert 'data-queue="mail"' in queues and 'id="throughput-mail"' in queues
    assert "Every 15 minutes" in client.get(reverse("dashboard:cron")).content.decode()
    assert 'id="chart-finished"' in client.get(reverse("dashboard:overview")).content.decode()


def test_the_job_page_its_events_pages_and_payload_search_open_on_sqlite() -> None:
    """The PostgreSQL-only paths (heartbeats binned in SQL, ILIKE in the C collation, the
    cron page's LATERAL) have plain fallbacks here."""
    from datetime import timedelta

    from django.utils import timezone

    from dashboard import selectors
    from jobs.models import Attempt, Job, JobEvent

    job = Job.objects.create(kind="test.echo", payload={"customer": "ACME"}, state="queued")
    t0 = timezone.now() - timedelta(seconds=30)
    Attempt.objects.create(job=job, number=1, worker="w:1", claimed_at=t0, outcome="running")
    JobEvent.objects.bulk_create(
        JobEvent(job=job, attempt=1, type="heartbeat", worker="w:1", at=t0 + timedelta(seconds=i))
        for i in range(selectors.LOG_ROWS + 10)
    )
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))
    page = client.get(reverse("dashboard:job", args=[job.pk]))
    assert page.status_code == 200 and 'class="lane"' in page.content.decode()
    assert sum(n for *_, n in page.context["detail"].minor) == selectors.LOG_ROWS + 10
    older = client.get(reverse("dashboard:job-events", args=[job.pk]), {"before": "999999999"})
    assert len(older.context["page"].events) == selectors.LOG_ROWS + 10
    found = client.get(reverse("dashboard:jobs"), {"q": "acme"}).context["page"].jobs
    assert [j.pk for j in found] == [job.pk]
