"""Tasks are jobs: the dashboard, the timeline, the admin and /metrics show them by module path."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.worker import runner
from tests.app import tasks
from tests.ops.test_metrics import TOKEN, scrape

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "tests.app.tasks.add"


@pytest.fixture
def ran() -> str:
    result = tasks.add.enqueue(1, 2)
    runner.drain()
    return result.id


@pytest.fixture
def admin_client_() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def test_the_dashboard_lists_a_task_by_its_module_path(ran, admin_client_):
    page = admin_client_.get("/jobs/")
    assert page.status_code == 200 and PATH in page.content.decode()
    overview = admin_client_.get("/")
    assert overview.status_code == 200


def test_the_timeline_of_a_task_shows_its_attempt(ran, admin_client_):
    page = admin_client_.get(f"/jobs/{ran}/")
    body = page.content.decode()
    assert page.status_code == 200 and PATH in body
    assert runner.worker_identity() in body


def test_the_admin_shows_a_task_by_its_module_path(ran, admin_client_):
    listing = admin_client_.get("/admin/jobs/job/")
    assert listing.status_code == 200 and PATH in listing.content.decode()
    change = admin_client_.get(f"/admin/jobs/job/{ran}/change/")
    assert change.status_code == 200 and PATH in change.content.decode()


def test_metrics_label_a_task_by_its_module_path(ran, client, settings):
    settings.JOBS_METRICS_TOKEN = TOKEN
    samples = scrape(client)
    assert f"jobs_lease_too_short{{kind={PATH}}}" in samples
    assert samples["jobs_succeeded_total"] >= 1
