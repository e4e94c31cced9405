"""The demo's handlers use every write path: demo.render stages a file and mails a notice,
demo.report writes its row through the token check and posts an intent the relay delivers to
the demo's own deduplicating receiver."""

import json

import pytest
from django.core import mail
from django.test import RequestFactory

import jobs
from demo import views
from demo.models import Delivery, Report
from jobs.effects import outbox
from jobs.models import IdempotencyKey, Intent, Job
from jobs.worker import runner
from tests.receiver import receiver

pytestmark = pytest.mark.django_db(transaction=True)


def test_render_stages_its_file_and_mails_one_notice(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    job = jobs.enqueue("demo.render", {"pages": 2, "seconds": 0})
    runner.drain(budget_seconds=5)
    job.refresh_from_db()
    assert job.state == "succeeded" and job.result_ref == f"jobs/{job.pk}/attempt-1/"
    assert (tmp_path / job.result["ref"]).read_text() == "page 1 of 2\npage 2 of 2"
    assert len(mail.outbox) == 1
    assert IdempotencyKey.objects.get(job=job).key == f"{job.pk}:notice"


def test_report_writes_its_row_fenced_and_posts_through_the_outbox(settings):
    with receiver() as r:
        settings.DEMO_WEBHOOK_URL = f"{r.url}/hook"
        job = jobs.enqueue("demo.report", {"name": "weekly", "rows": 4})
        runner.drain(budget_seconds=5)
        assert Job.objects.get(pk=job.pk).state == "succeeded"
        report = Report.objects.get(name="weekly")
        assert (report.rows, report.fence_job_id, report.fence_attempt) == (4, job.pk, 1)
        assert outbox.relay_once("relay-a") == 1
        assert r.verdicts(f"{job.pk}:publish") == ["performed"]
        assert Intent.objects.get().state == "done"


def test_the_demo_receiver_deduplicates_by_key_and_answers_the_check():
    factory = RequestFactory()

    def post(key: str) -> dict[str, str]:
        request = factory.post(
            "/demo/hook/", json.dumps({"a": 1}), "application/json", HTTP_IDEMPOTENCY_KEY=key
        )
        return json.loads(views.hook(request).content)

    assert views.check(factory.get("/demo/hook/check/", {"key": "7:publish"})).status_code == 404
    assert post("7:publish")["verdict"] == "performed"
    assert post("7:publish")["verdict"] == "deduplicated"
    assert views.check(factory.get("/demo/hook/check/", {"key": "7:publish"})).status_code == 200
    assert Delivery.objects.get().repeats == 1
    assert views.hook(factory.post("/demo/hook/", "{}", "application/json")).status_code == 400
