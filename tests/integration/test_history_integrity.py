"""jobs_attempt and jobs_jobevent have no database foreign key (migration
0017_hot_history_unconstrained: the check cost the drain about a fifth of the database's CPU per
job). What that check guarded is kept by construction, and these tests are what would catch a
change that breaks it: a history row is written only for a job that exists, and a job is never
deleted without its history.
"""

import pytest
from django.db import connection

import jobs
from jobs.core import transitions
from jobs.core.transitions import LeaseLost
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from jobs.ops import retention

HISTORY = ("jobs_attempt", "jobs_jobevent", "jobs_rejectedwrite")


def strays() -> dict[str, int]:
    """History rows, per table, whose job is not in jobs_job."""
    found = {}
    with connection.cursor() as cur:
        for table in HISTORY:
            cur.execute(
                f"SELECT count(*) FROM {table} h "
                "WHERE NOT EXISTS (SELECT 1 FROM jobs_job j WHERE j.id = h.job_id)"
            )
            found[table] = cur.fetchone()[0]
    return found


def run_to_the_end(n: int) -> list[int]:
    """n jobs enqueued, claimed and committed by the hot statements; their ids."""
    ids = [jobs.enqueue("demo.noop", {"i": i}).pk for i in range(n)]
    claimed = transitions.claim("w:1", limit=n, lease_seconds=30)
    assert sorted(c.fence.job_id for c in claimed) == sorted(ids)
    for c in claimed:
        transitions.commit(c.fence, {"ok": True})
    return ids


def test_the_hot_tables_carry_no_foreign_key_and_the_others_keep_theirs(db):
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint "
            "WHERE contype = 'f' AND confrelid = 'jobs_job'::regclass"
        )
        constrained = {row[0] for row in cur.fetchall()}
    assert not constrained & {"jobs_attempt", "jobs_jobevent"}
    assert {"jobs_rejectedwrite", "jobs_stagedoutput", "jobs_intent"} <= constrained


def test_deleting_jobs_through_django_deletes_their_attempts_and_events(db):
    ids = run_to_the_end(4)
    assert Attempt.objects.filter(job_id__in=ids).count() == 4
    assert JobEvent.objects.filter(job_id__in=ids).count() >= 12  # enqueued, claimed, succeeded
    Job.objects.get(pk=ids[0]).delete()  # the admin's delete of one job
    Job.objects.filter(pk__in=ids[1:3]).delete()  # the admin's "delete selected"
    assert not Attempt.objects.filter(job_id__in=ids[:3]).exists()
    assert not JobEvent.objects.filter(job_id__in=ids[:3]).exists()
    assert Attempt.objects.filter(job_id=ids[3]).count() == 1  # the one left keeps its history
    assert strays() == dict.fromkeys(HISTORY, 0)


def test_prune_deletes_the_history_the_hot_statements_wrote(db):
    ids = run_to_the_end(3)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET finished_at = finished_at - interval '30 days', "
            "updated_at = updated_at - interval '30 days' WHERE id = ANY(%s)",
            [ids],
        )
    assert retention.prune(7).jobs == 3
    assert strays() == dict.fromkeys(HISTORY, 0)
    assert not Attempt.objects.exists() and not JobEvent.objects.exists()


@pytest.mark.parametrize(
    "write",
    [
        lambda f: transitions.heartbeat(f, 30),
        lambda f: transitions.checkpoint(f, {"step": 2}, 30),
        lambda f: transitions.commit(f, {"late": True}),
        lambda f: transitions.fail(f, "late failure", retry_in=None),
        lambda f: transitions.fail(f, "late failure", retry_in=5),
        lambda f: transitions.release(f),
        lambda f: transitions.mark_lost(f),
    ],
    ids=["heartbeat", "checkpoint", "commit", "fail", "fail-and-retry", "release", "lost"],
)
def test_a_worker_writing_for_a_job_deleted_under_it_leaves_no_history_behind(db, write):
    """An operator deletes a running job; its worker's next write changes nothing and writes no
    attempt, event or rejected-write row for the job that is gone (the foreign key would have
    refused such a row; without it, the statements must never write one)."""
    job = jobs.enqueue("demo.noop", {})
    (claimed,) = transitions.claim("w:1", limit=1, lease_seconds=30)
    Job.objects.filter(pk=job.pk).delete()
    assert strays() == dict.fromkeys(HISTORY, 0)
    try:
        write(claimed.fence)
    except LeaseLost:
        pass
    assert strays() == dict.fromkeys(HISTORY, 0)
    assert not RejectedWrite.objects.exists()
