"""Two clusters in containers that share a hostname (host networking, compose's `hostname:`)
number their worker processes alike: pid 9 in each. The rescue fences on the worker identity
written in the attempt, so one cluster's rescue of its dead pid 9 took the other's live pid 9's
jobs: run twice at once, the live one's commit refused. A worker in a pid namespace of its own
now names it in its identity (jobs.worker.rescue.owner_of). Real pid namespaces (unshare)."""

import os
import shutil
import subprocess
import sys

import pytest

from jobs.worker import rescue

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs unshare and root for a pid namespace",
)

_OWNER_OF_ONE = "from jobs.worker.rescue import owner_of; print(owner_of(1))"


def _in_new_pid_namespace() -> str:
    out = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", _OWNER_OF_ONE],
        cwd=os.getcwd(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_the_same_pid_in_two_pid_namespaces_is_two_workers():
    first, second = _in_new_pid_namespace(), _in_new_pid_namespace()
    assert first != second
    assert first.rsplit(":", 1)[1] == second.rsplit(":", 1)[1] == "1"
    assert rescue.owner_of(1) not in (first, second)


def test_the_identity_is_still_hostname_and_pid_first_and_last():
    import socket

    owner = rescue.owner_of(os.getpid())
    assert owner.startswith(socket.gethostname()) and owner.endswith(f":{os.getpid()}")
