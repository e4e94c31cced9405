"""Stopping qcluster the way process supervisors do."""

import os
import signal
import time

import pytest

from jobs import enqueue
from tests.acceptance.cluster import POLL_SECONDS, wait_for_state

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_whole_process_group_stops_every_process(start_qcluster, sig):
    """systemd's default stop (KillMode=control-group) and a terminal's Ctrl-C signal every
    process of the group at once, the sentinel and workers included."""
    cluster = start_qcluster()
    job = enqueue("test.echo")
    wait_for_state(job.pk, "succeeded")  # the cluster is up and has run work
    os.killpg(cluster.pgid, sig)
    deadline = time.monotonic() + 15
    while not group_gone(cluster.pgid):
        if time.monotonic() > deadline:
            pytest.fail(f"qcluster group still alive 15 s after {sig.name}:\n{cluster.log()}")
        cluster.proc.poll()  # reap the command once it exits
        time.sleep(POLL_SECONDS)
