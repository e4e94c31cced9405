"""The README's handler-side example runs as written: it is extracted from the README, registered,
drained, and every write path it uses lands."""

import re
from pathlib import Path

import pytest

import jobs
from demo.models import Report
from jobs.effects import outbox
from jobs.models import IdempotencyKey, Intent, Job
from jobs.worker import runner
from tests.receiver import receiver

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_readme_example_runs(settings, tmp_path):
    section = README.read_text().split("## Every write path fenced", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    settings.MEDIA_ROOT = str(tmp_path)
    with receiver() as r:
        code = code.replace('"http://127.0.0.1:8000/demo/hook/"', repr(f"{r.url}/hook/"))
        from jobs.core.registry import _handlers

        try:
            exec(compile(code, "README.md", "exec"), {})
            job = jobs.enqueue("render")
            runner.drain(budget_seconds=5)
            done = Job.objects.get(pk=job.pk)
            assert done.state == "succeeded", done.error
            assert (tmp_path / done.result["ref"]).read_bytes() == b"page 1"
            assert done.result["receipt"] == {"charged": 7, "key": f"{job.pk}:charge"}
            assert IdempotencyKey.objects.filter(job=job).count() == 2  # charge, notice
            assert Report.objects.get(name="daily").fence_attempt == 1
            assert Intent.objects.get(job=job).state == "pending"
            assert outbox.relay_once("relay-a") == 1
            assert r.verdicts(f"{job.pk}:publish") == ["performed"]
        finally:
            _handlers.pop("render", None)
