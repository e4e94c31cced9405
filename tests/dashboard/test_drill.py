"""The zombie drill: `manage.py drill` against a real local cluster, and its safety checks."""

import os
import shutil
import socket
import subprocess
import sys
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


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs unshare and root for a pid namespace",
)
def test_drill_in_a_container_takes_its_own_workers_identity_and_refuses_the_hosts(
    tmp_path: Path,
) -> None:
    """In a pid namespace of its own (a container) a worker's identity names the namespace
    (jobs.worker.rescue.owner_of): the drill must read the pid out of that identity, and refuse
    the same pid written as the host's namespace would write it."""
    probe = tmp_path / "probe.py"  # run as a file: its command line must not name the cluster
    probe.write_text(
        "import os, socket\n"
        "import django\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'tests.settings')\n"
        "django.setup()\n"
        "from demo import drill\n"
        "from jobs.worker.rescue import owner_of\n"
        "mine, hosts = owner_of(os.getpid()), f'{socket.gethostname()}:{os.getpid()}'\n"
        "assert mine != hosts, mine\n"
        "for identity in (mine, hosts):\n"
        "    try:\n"
        "        drill.local_worker_pid(identity)\n"
        "    except drill.DrillError as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(probe)],
        cwd=os.getcwd(),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert done.returncode == 0, done.stderr
    mine, hosts = done.stdout.splitlines()
    assert mine == "process 1 is not a qcluster worker", done.stdout
    assert "is not a process on this host" in hosts, done.stdout


def test_drill_refuses_a_local_process_that_is_not_a_qcluster_worker() -> None:
    with pytest.raises(drill.DrillError, match="not a qcluster worker"):
        drill.local_worker_pid(f"{socket.gethostname()}:{os.getpid()}")
