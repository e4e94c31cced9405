"""A commit whose connection dies carries the attempt's outputs and intents: nothing is deleted
or re-sent until the attempt's own row says what happened (invariant 10)."""

import time

import pytest

import jobs
from jobs.models import Intent, Job, StagedOutput
from jobs.worker import completer
from jobs.worker.heartbeat import Finished
from tests.integration.attempts import claim
from tests.integration.test_commit_outcome_unknown import COMMIT_MARKER, proxied

__all__ = ["proxied"]

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("after_reply", [True, False], ids=["landed", "lost-before-landing"])
def test_outputs_and_intents_survive_a_commit_whose_outcome_was_unknown(
    proxied, settings, tmp_path, after_reply
):
    settings.MEDIA_ROOT = str(tmp_path)
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    ref = running.ctx.stage("out.txt", "mine")
    running.ctx.intent("publish", "webhook", {"url": "http://127.0.0.1:9/", "json": {}})
    proxied.cut_on(COMMIT_MARKER, after_reply=after_reply)

    completer.commit([Finished(running.held, running.claimed, "ok", time.monotonic())])

    assert proxied.cuts == 1
    done = Job.objects.get(pk=job.pk)
    assert (done.state, done.result_ref) == ("succeeded", f"jobs/{job.pk}/attempt-1/")
    assert (tmp_path / ref).read_text() == "mine"  # never deleted as if the commit had failed
    assert StagedOutput.objects.get().status == "staged"
    assert Intent.objects.filter(job=job).count() == 1
