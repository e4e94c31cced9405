"""The zombie drill: `manage.py drill` against a real local cluster, and its safety checks."""

import os
import socket
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from demo import drill
from jobs.models import Attempt, Job, RejectedWrite
from tests.acceptance.cluster import QCluster, running_clusters


@pytest.fixture
def qcluster(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., QCluster]]:
    with running_clusters(tmp_path) as (start, _started):
        yield start


@pytest.mark.acceptance
def test_drill_command_stages_a_zombie_whose_write_is_refused(
    qcluster: Callable[..., QCluster],
) -> None:
    qcluster()
    out = StringIO()
    call_command("drill", "--timeout", "40", stdout=out)
    job = Job.objects.get(kind="demo.drill")
    assert (job.state, job.attempt) == ("succeeded", 2)
    first, second = Attempt.objects.filter(job=job).order_by("number")
    assert first.worker != second.worker
    refused = RejectedWrite.objects.get(job=job, attempt_presented=1)
    assert refused.attempt_current == 2
    assert f"job {job.pk}:" in out.getvalue() and "was rejected" in out.getvalue()


def test_drill_refuses_a_worker_on_another_host() -> None:
    with pytest.raises(drill.DrillError, match="not a process on this host"):
        drill.local_worker_pid("elsewhere.example:123")


def test_drill_refuses_a_local_process_that_is_not_a_qcluster_worker() -> None:
    with pytest.raises(drill.DrillError, match="not a qcluster worker"):
        drill.local_worker_pid(f"{socket.gethostname()}:{os.getpid()}")
