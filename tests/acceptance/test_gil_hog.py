"""A handler that holds the GIL in C code far past its lease (a catastrophic regex, a huge
integer power) no longer freezes the cluster until its execution timeout.

Its worker process cannot run a single other thread: no heartbeat, so the lease expires and
the reaper hands the job to the next worker, which freezes the same way -- every worker stuck
until Q_TIMEOUT (30 minutes by default) + 5 s. A process in which no thread has run for longer
than its running job's lease can never land a write again (its lease is gone, its writes are
fenced): qcluster's main process now kills it then (jobs.worker.watchdog), and django-q2 replaces
it. Real qcluster, leases of 2 s, Q_TIMEOUT at its default (1800 s)."""

import time

import pytest

from jobs import enqueue
from jobs.models import Attempt
from tests.acceptance.cluster import wait_for_state, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

HOG_SECONDS = 90.0


def test_a_handler_holding_the_gil_past_its_lease_does_not_freeze_the_cluster(start_qcluster):
    cluster = start_qcluster()  # two workers
    hog = enqueue(
        "test.stuck_in_c", {"seconds": HOG_SECONDS, "holding_the_gil": True}, max_attempts=2
    )
    # Both workers take their turn at it (the first attempt expires uncharged and is confirmed
    # explicitly the second time), then it has failed for good.
    started = time.monotonic()
    wait_for_state(hog.pk, "failed", timeout=45)
    took = time.monotonic() - started
    assert took < HOG_SECONDS / 2, f"the hog held workers for {took:.0f} s"
    quick = [enqueue("test.echo", {"n": n}) for n in range(4)]
    for job in quick:
        wait_for_state(job.pk, "succeeded", timeout=15)
    assert Attempt.objects.filter(job=hog).count() >= 2
    wait_until(
        lambda: "no thread of it has run" in cluster.log(),
        timeout=5,
        what="the main process to log the kill",
        job_id=hog.pk,
    )
