"""Operator transitions and actions: fenced requeue/cancel/retry, copies, reports, audit."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User

from jobs.core import transitions
from jobs.core.exceptions import LeaseLost
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.models import Attempt, Job, JobEvent, RejectedWrite
from jobs.ops import actions

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_user(db):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_job"))
    return User.objects.get(pk=user.pk)  # permission cache fresh


def test_requeue_takes_a_running_job_back_and_the_workers_commit_is_rejected(make_job):
    job = make_job(state=JobState.RUNNING, attempt=3, worker="host-a:1")
    result = transitions.requeue(job.pk, "ops (test)")
    assert result.changed and result.attempt == 3 and result.state_before == "running"
    job.refresh_from_db()
    assert (job.state, job.attempt, job.lease_expires_at) == ("queued", 3, None)
    assert job.attempts_released == 3  # a fresh budget: earlier claims no longer count
    assert Attempt.objects.get(job=job, number=3).outcome == "requeued"
    with pytest.raises(LeaseLost):
        transitions.commit(Fence(job.pk, 3, "host-a:1"), {"late": True})
    job.refresh_from_db()
    assert job.state == "queued" and job.result is None
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.worker) == (
        "commit",
        3,
        "host-a:1",
    )
    assert JobEvent.objects.filter(job=job, type="requeued", attempt=3).exists()


def test_cancel_of_a_running_job_makes_its_next_heartbeat_lose_the_lease(make_job):
    job = make_job(state=JobState.RUNNING, attempt=1, worker="host-a:1")
    assert transitions.cancel(job.pk, "ops (test)").changed
    job.refresh_from_db()
    assert job.state == "cancelled" and job.finished_at is not None
    assert Attempt.objects.get(job=job, number=1).outcome == "cancelled"
    with pytest.raises(LeaseLost):
        transitions.heartbeat(Fence(job.pk, 1, "host-a:1"), 30.0)
    assert Attempt.objects.get(job=job, number=1).outcome == "cancelled"  # first outcome kept


def test_cancel_skips_terminal_jobs_and_requeue_skips_live_or_succeeded_ones(make_job):
    done = make_job(state=JobState.SUCCEEDED, attempt=1)
    queued = make_job()
    assert transitions.cancel(done.pk, "ops").reason == "already succeeded"
    assert transitions.requeue(queued.pk, "ops").reason == "already queued"
    assert "enqueue a copy" in transitions.requeue(done.pk, "ops").reason
    done.refresh_from_db()
    assert done.state == "succeeded"


def test_retry_now_gives_a_failed_job_a_fresh_budget(make_job):
    job = make_job(kind="test.fail", state=JobState.FAILED, attempt=2)
    assert transitions.retry_now(job.pk, "ops").changed
    job.refresh_from_db()
    assert (job.state, job.finished_at, job.attempts_released) == ("queued", None, 2)
    assert Job.objects.due().filter(pk=job.pk).exists()


def test_retry_now_runs_a_job_waiting_for_its_backoff_now_and_skips_a_due_one(make_job):
    from datetime import timedelta

    from django.utils import timezone

    waiting = make_job(run_at=timezone.now() + timedelta(hours=1), attempt=1)
    due = make_job()
    assert transitions.retry_now(waiting.pk, "ops").changed
    assert Job.objects.due().filter(pk=waiting.pk).exists()
    result = transitions.retry_now(due.pk, "ops")
    assert not result.changed and result.reason == "already due"


def test_requeue_of_a_failed_job_whose_unique_key_is_held_again_is_skipped(make_job):
    old = make_job(state=JobState.FAILED, attempt=1, unique_key="order-1")
    make_job(unique_key="order-1")
    result = transitions.requeue(old.pk, "ops")
    assert not result.changed and "unique_key" in result.reason
    old.refresh_from_db()
    assert old.state == "failed"


def test_apply_reports_changed_and_skipped_with_reasons_and_audits_attempts(
    make_job, operator_user
):
    running = make_job(state=JobState.RUNNING, attempt=4)
    failed = make_job(state=JobState.FAILED, attempt=1)
    queued = make_job()
    report = actions.apply(
        "requeue", [running.pk, failed.pk, queued.pk], user=operator_user, via="test"
    )
    assert sorted(r.job_id for r in report.changed) == sorted([running.pk, failed.pk])
    assert report.skipped == {"already queued": 1}
    assert "2 changed, 1 skipped (1 already queued)" in report.summary()
    entry = LogEntry.objects.get(object_id=str(running.pk))
    assert "fenced by attempt 4" in entry.change_message and entry.user_id == operator_user.pk


def test_apply_to_all_matching_a_filter_stops_at_the_limit_and_says_so(make_job, operator_user):
    for _ in range(5):
        make_job(state=JobState.FAILED, attempt=1)
    report = actions.apply(
        "retry", Job.objects.filter(state="failed"), user=operator_user, via="test", limit=3
    )
    assert len(report.changed) == 3 and report.not_processed == 2
    assert Job.objects.filter(state="failed").count() == 2


def test_enqueue_a_copy_validates_like_enqueue(make_job, operator_user):
    good = make_job(kind="test.echo", payload={"a": 1}, priority=5)
    gone = make_job(kind="no.such.kind")
    report = actions.apply("copy", [good.pk, gone.pk], user=operator_user, via="test")
    (copied,) = report.changed
    copy = Job.objects.get(pk=copied.new_job_id)
    assert (copy.kind, copy.payload, copy.priority, copy.state) == (
        "test.echo",
        {"a": 1},
        5,
        "queued",
    )
    assert list(report.skipped) == [
        "refused by enqueue: no handler is registered for kind 'no.such.kind'"
    ]


def test_a_user_without_the_change_permission_cannot_apply(make_job):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    job = make_job(state=JobState.FAILED, attempt=1)
    with pytest.raises(PermissionError):
        actions.apply("retry", [job.pk], user=viewer, via="test")
    job.refresh_from_db()
    assert job.state == "failed"
