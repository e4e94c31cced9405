"""A whole cluster paused and resumed (a suspended VM, `docker pause`, Ctrl-Z of bin/run, a
SIGSTOP of its process group) has no frozen worker. qcluster's main process was paused with its
workers and saw no pulse meanwhile; resumed, its watchdog looked before a busy worker's pulse
thread got the GIL back and SIGKILLed the healthy worker ("no thread of it has run for 8 s").
Real qcluster, leases of 2 s, a handler busy in Python code (the GIL switching)."""

import os
import signal
import time

import pytest

from jobs import enqueue
from jobs.worker import watchdog
from tests.acceptance.cluster import LEASE_SECONDS, wait_for_attempt, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

PAUSES = 2


def _group_states(pgid: int) -> set[str]:
    """The state letters of the processes of the group (from /proc)."""
    states = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            if int(fields[2]) == pgid:
                states.add(fields[0])
    return states


def test_a_paused_and_resumed_cluster_kills_no_healthy_worker(start_qcluster):
    cluster = start_qcluster()
    job = enqueue("test.script", {"spin": 120.0}, max_attempts=1)
    worker = wait_for_attempt(job.pk, 1, timeout=20).worker
    pid = int(worker.rsplit(":", 1)[1])
    unseen = LEASE_SECONDS + watchdog.KILL_MARGIN_SECONDS + 1.0  # past what the watchdog allows
    for _ in range(PAUSES):
        os.killpg(cluster.pgid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_until(
            lambda: _group_states(cluster.pgid) <= {"T", "t"},
            timeout=5,
            what="the whole group stopped",
            job_id=job.pk,
        )
        wait_until(
            lambda t=stopped + unseen: time.monotonic() > t,
            timeout=unseen + 1,
            what="the pause to outlast lease + margin",
            job_id=job.pk,
        )
        os.killpg(cluster.pgid, signal.SIGCONT)
        resumed = time.monotonic()
        wait_until(  # the watchdog looks every LOOK_SECONDS: several looks after the resume
            lambda t=resumed + 8 * watchdog.LOOK_SECONDS: time.monotonic() > t,
            timeout=5,
            what="the watchdog's looks after the resume",
            job_id=job.pk,
        )
        assert "no thread of it has run" not in cluster.log()
        assert os.path.exists(f"/proc/{pid}"), "the busy, healthy worker was killed"
