"""Real `qcluster`s: urgent work runs first, a paused queue waits, a limit holds across clusters.

Times are the database's (Attempt.claimed_at / ended_at, Job.created_at); the bounds are loose
enough for a loaded machine -- the benchmark (bench/mixed.py) measures the real figures.
"""

import random
import time

import pytest
from django.db.models import Count, Max

import jobs
from jobs.models import Attempt, Job
from jobs.ops import queues
from tests.acceptance.cluster import POLL_SECONDS, wait_for_state
from tests.concurrency.test_queue_limit_race import most_running_at_once

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def wait_all(query, n: int, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while query.count() < n:
        states = list(Job.objects.values("queue", "state").annotate(n=Count("id")))
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {states}"
        time.sleep(POLL_SECONDS)  # the poll interval of a deadline-bound wait


def test_an_urgent_job_runs_before_a_low_priority_backlog_with_a_bounded_attempt(start_qcluster):
    start_qcluster(JOBS_CLAIM_BATCH="8", JOBS_WORKERS="2")
    rng = random.Random(16)
    # Quick jobs first grow the drains' claim batch to 8, then 0.1-0.4 s handlers follow.
    quick = [jobs.enqueue("test.echo", {"n": n}, priority=0) for n in range(16)]
    backlog = [
        jobs.enqueue("test.script", {"seconds": rng.uniform(0.1, 0.4)}, priority=0)
        for _ in range(40)
    ]
    wait_all(Job.objects.filter(state="succeeded"), len(quick) + 4, 60, "the backlog to start")
    urgent = jobs.enqueue("test.echo", {"urgent": True}, priority=10)
    done = wait_for_state(urgent.pk, "succeeded", timeout=60)
    first = Attempt.objects.filter(job=urgent).order_by("number").first()
    assert first is not None
    started_after = (first.claimed_at - done.created_at).total_seconds()
    still_waiting = Job.objects.filter(pk__in=[j.pk for j in backlog]).exclude(
        state="succeeded", finished_at__lt=done.finished_at
    )
    # It started at the next claim of a worker, ahead of the many backlog jobs not yet done...
    assert still_waiting.count() >= 20, still_waiting.count()
    assert started_after < 3.0, started_after
    # ...on one of its first attempts: claims of it were not handed back over and over.
    assert done.attempt <= 3, done.attempt
    wait_all(Job.objects.filter(state="succeeded"), 57, 120, "the backlog to finish")
    top = Job.objects.filter(pk__in=[j.pk for j in backlog]).aggregate(top=Max("attempt"))
    assert top["top"] <= 3, top  # before: attempts of 24-30 behind such a backlog


def test_a_paused_queue_waits_while_others_run_and_resume_wakes_its_workers(start_qcluster):
    # A long poll: whatever starts quickly after the resume was woken by its NOTIFY.
    start_qcluster(JOBS_POLL_SECONDS="5", JOBS_WORKERS="2")
    long = jobs.enqueue("test.script", {"seconds": 1.5}, queue="mail")
    wait_for_state(long.pk, "running", timeout=30)
    assert queues.pause("mail", actor=None)
    urgent_mail = [jobs.enqueue("test.echo", {"n": n}, queue="mail", priority=10) for n in range(3)]
    other = jobs.enqueue("test.echo", queue="default")
    # The cluster claimed after the mail jobs were due and took the lower-priority one instead;
    # the job already running finished.
    wait_for_state(other.pk, "succeeded", timeout=30)
    wait_for_state(long.pk, "succeeded", timeout=30)
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in urgent_mail]).values_list("state", flat=True)
    ) == {"queued"}
    resumed = time.monotonic()
    assert queues.resume("mail", actor=None)
    for job in urgent_mail:
        wait_for_state(job.pk, "succeeded", timeout=30)
    assert time.monotonic() - resumed < 4.0  # woken at once, not at the next 5 s poll


def test_a_concurrency_limit_holds_across_two_clusters(start_qcluster):
    queues.set_limit("limited", 2, actor=None)
    for n in range(24):
        jobs.enqueue("test.script", {"seconds": 0.1}, queue="limited")
        jobs.enqueue("test.echo", {"n": n}, queue="default")
    start_qcluster(JOBS_CLAIM_BATCH="4", JOBS_WORKERS="3")
    start_qcluster(JOBS_CLAIM_BATCH="4", JOBS_WORKERS="3")
    wait_all(Job.objects.filter(state="succeeded"), 48, 120, "every job to succeed")
    limited = Attempt.objects.filter(job__queue="limited").values_list("claimed_at", "ended_at")
    most = most_running_at_once(list(limited))
    assert most <= 2, f"{most} jobs of a queue limited to 2 ran at once"


def test_raising_a_queues_limit_wakes_its_idle_workers_at_once(start_qcluster):
    # A long poll: whatever starts quickly after the raise was woken by its NOTIFY.
    start_qcluster(JOBS_POLL_SECONDS="10", JOBS_WORKERS="2", JOBS_CLAIM_BATCH="1")
    queues.set_limit("mail", 1, actor=None)
    long = jobs.enqueue("test.script", {"seconds": 8}, queue="mail")
    wait_for_state(long.pk, "running", timeout=30)
    held = [jobs.enqueue("test.echo", {"n": n}, queue="mail") for n in range(3)]
    other = jobs.enqueue("test.echo", queue="default")
    wait_for_state(other.pk, "succeeded", timeout=30)  # a worker is idle; the limit holds these
    assert set(Job.objects.filter(pk__in=[j.pk for j in held]).values_list("state", flat=True)) == {
        "queued"
    }
    raised = time.monotonic()
    queues.set_limit("mail", 4, actor=None)
    for job in held:
        wait_for_state(job.pk, "succeeded", timeout=30)
    assert Job.objects.get(pk=long.pk).state == "running"  # before the long job's end, too
    assert time.monotonic() - raised < 4.0  # woken at once, not at the next 10 s poll
