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
