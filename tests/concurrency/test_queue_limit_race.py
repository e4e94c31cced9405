"""A queue's concurrency limit under racing claims: many claimers, each on its own connection,
claim batches from one limited queue as fast as they can and end each job at once; at no moment
may more jobs of the queue be running than the limit.

The moments are the database's own: an attempt runs from its claim (claimed_at) to its end
(ended_at), both taken by clock_timestamp() inside the statements that claim and end it, so
overlapping intervals are jobs running at the same time. (A claim that could see a job's end
started after that end committed, so its claimed_at is later: no false overlap.)
"""

import random
import threading
import time

import pytest
from django.db import connection, connections

import jobs
from jobs.core import transitions
from jobs.models import Attempt
from jobs.ops import queues

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="concurrent sessions"),
]
LIMIT = 3
CLAIMERS = 8
JOBS = 300


def most_running_at_once(intervals: list[tuple[object, object]]) -> int:
    points = [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    running = most = 0
    for _, step in sorted(points, key=lambda p: (p[0], p[1])):  # an end before a start at a tie
        running += step
        most = max(most, running)
    return most


def test_concurrent_claims_never_run_more_of_a_limited_queue_than_its_limit():
    queues.set_limit("hot", LIMIT, actor=None)
    for i in range(JOBS):
        jobs.enqueue("test.echo", {"n": i}, queue="hot")
    errors: list[BaseException] = []
    start = threading.Barrier(CLAIMERS)
    deadline = time.monotonic() + 60

    def claimer(n: int) -> None:
        rng = random.Random(n)
        try:
            start.wait()
            while time.monotonic() < deadline:
                batch = transitions.claim(f"racer:{n}", limit=4, lease_seconds=30, queues=["hot"])
                if not batch:
                    with connection.cursor() as cur:
                        cur.execute("SELECT count(*) FROM jobs_job WHERE state <> 'succeeded'")
                        if cur.fetchone()[0] == 0:
                            return
                    continue
                time.sleep(rng.random() * 0.003)  # the handler
                for c in batch:
                    transitions.commit(c.fence, None)
        except BaseException as exc:  # noqa: BLE001  (reported by the test thread)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    attempts = list(Attempt.objects.values_list("claimed_at", "ended_at", "outcome"))
    assert len(attempts) == JOBS and {a[2] for a in attempts} == {"succeeded"}
    most = most_running_at_once([(a[0], a[1]) for a in attempts])
    assert most <= LIMIT, f"{most} jobs of a queue limited to {LIMIT} ran at once"
    assert most == LIMIT  # the claimers did race for the last slot
