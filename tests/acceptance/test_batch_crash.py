"""A job that kills its worker process (SIGKILL, as the OOM killer does) decides only its own
fate: the batch-mates claimed with it are requeued uncharged and run, the poison job ends failed
with its own error. Real `manage.py qcluster`, one worker process so the drain's adaptive batch
(1, 2, then 4 jobs) is deterministic."""

import pytest

from jobs import enqueue
from jobs.models import Attempt, Job
from tests.acceptance.cluster import wait_for_state

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_a_job_that_kills_its_worker_fails_alone_and_its_batch_mates_are_not_charged(
    start_qcluster,
):
    # Enqueued before the cluster starts: the warm-ups fill the drain's first two claims, and
    # the next claim takes the four scripted jobs together.
    for _ in range(3):
        enqueue("test.echo", priority=100)
    before = enqueue("test.script", {"return": 1}, max_attempts=1)
    poison = enqueue("test.script", {"kill": True}, max_attempts=1)
    after = [enqueue("test.script", {"return": n}, max_attempts=1) for n in (3, 4)]
    start_qcluster(JOBS_CLAIM_BATCH="8", JOBS_WORKERS="1")

    for job in [before, *after]:
        done = wait_for_state(job.pk, "succeeded", timeout=40)
        assert done.attempts_released >= 1  # its first attempt died with the batch, uncharged
    for job in after:
        # Claimed with the poison job and never started: its first attempt expired unconfirmed.
        first = Attempt.objects.get(job=job, number=1)
        assert (first.outcome, first.running_confirmed_at) == ("expired", None)

    failed = wait_for_state(poison.pk, "failed", timeout=40)
    # First killed before any beat (uncharged), then confirmed before it ran again: charged.
    assert (failed.attempt, failed.attempts_released) == (2, 1)
    # Its worker's death was seen by qcluster's main process, which reclaimed it at once.
    assert "worker process exited without ending it" in failed.error
    second = Attempt.objects.get(job=poison, number=2)
    assert second.outcome == "expired" and second.running_confirmed_at is not None
    assert Job.objects.filter(state="running").count() == 0


@pytest.mark.parametrize("base", ["SystemExit", "KeyboardInterrupt"])
def test_a_base_exception_in_a_real_worker_fails_its_job_and_settles_its_batch(
    start_qcluster, base
):
    """README: a BaseException escaping a handler fails *that* job with its own error, commits
    the successes of its batch and hands the unstarted jobs back (released, uncharged) -- here
    in a real worker process, where it then ends the drain (tests/integration/
    test_batch_isolation.py drains in this process)."""
    for _ in range(3):  # the warm-ups fill the drain's first two claims (see above)
        enqueue("test.echo", priority=100)
    before = enqueue("test.script", {"return": 1}, max_attempts=1)
    crash = enqueue("test.script", {"base": base}, max_attempts=1)
    after = [enqueue("test.script", {"return": n}, max_attempts=1) for n in (3, 4)]
    start_qcluster(JOBS_CLAIM_BATCH="8", JOBS_WORKERS="1")

    failed = wait_for_state(crash.pk, "failed", timeout=40)
    assert f"handler raised {base}" in failed.error
    assert list(Attempt.objects.filter(job=crash).values_list("outcome", flat=True)) == ["failed"]
    assert wait_for_state(before.pk, "succeeded", timeout=40).attempt == 1
    for job in after:
        done = wait_for_state(job.pk, "succeeded", timeout=40)
        assert (done.attempt, done.attempts_released) == (2, 1)
        assert Attempt.objects.get(job=job, number=1).outcome == "released"
    assert Job.objects.filter(state="running").count() == 0
