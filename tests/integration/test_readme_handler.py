"""README, the `ctx` table: "`job_id`, `attempt`, `kind`, `payload`, `worker` -- the job's id,
this attempt's number (the fencing token), the handler's name, the JSON payload,
`"<hostname>:<pid>"`". The acceptance tests read the pid out of `worker` to signal a worker;
this pins the whole of each value a handler is given."""

import os
import socket

import pytest

import jobs
from jobs.models import Attempt
from jobs.worker import runner

pytestmark = pytest.mark.django_db(transaction=True)


def test_ctx_names_the_job_its_attempt_kind_payload_and_the_hostname_and_pid_running_it(
    swap_handler,
):
    def tell(ctx):
        return {
            "job_id": ctx.job_id,
            "attempt": ctx.attempt,
            "kind": ctx.kind,
            "payload": ctx.payload,
            "worker": ctx.worker,
        }

    swap_handler("test.echo", tell)
    job = jobs.enqueue("test.echo", {"pages": [1, "two", None]})
    assert runner.drain() == 1
    job.refresh_from_db()
    here = f"{socket.gethostname()}:{os.getpid()}"
    assert job.result == {
        "job_id": job.pk,
        "attempt": 1,
        "kind": "test.echo",
        "payload": {"pages": [1, "two", None]},
        "worker": here,
    }
    assert Attempt.objects.get(job=job, number=1).worker == here
