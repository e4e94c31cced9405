"""A real zombie stopped (SIGSTOP) inside its handler's own transaction, after its token-checked
write and before that transaction's COMMIT, against real `manage.py qcluster` processes: the
job is taken over meanwhile, and the resumed zombie's COMMIT is refused by the database
(jobs/core/sql/fenced.py), so nothing of its transaction remains. Without the COMMIT's check its
rows would land: the UPDATE itself ran while attempt 1 still owned the job."""

import pytest

from demo.models import Report
from jobs import enqueue
from jobs.models import Job
from tests.acceptance.cluster import (
    pause_first_attempt_until_reclaimed,
    wait_for_db_clock_past,
    wait_for_rejection,
    wait_for_state,
    wait_until,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FIRST_SECONDS = 1.5  # attempt 1's sleep inside its transaction: run out when it is resumed


@pytest.mark.parametrize("write_only", [False, True], ids=["write and create", "write only"])
def test_a_zombie_stopped_before_its_transaction_commits_has_its_commit_refused(
    start_qcluster, write_only
):
    # "write only": no fenced_create in the transaction, whose own check at the COMMIT would
    # refuse it all the same -- the UPDATE's check alone decides.
    cluster = start_qcluster()
    report = Report.objects.create(name="shared")
    job = enqueue(
        "test.token_write_in_transaction",
        {
            "report": "shared",
            "write_only": write_only,
            "seconds_by_attempt": {"1": FIRST_SECONDS, "2": 0.1},
        },
    )
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)
    # Attempt 2's write waits on the row the stopped zombie's transaction has locked.
    wait_for_db_clock_past(job.pk, reclaimed.paused_at, FIRST_SECONDS)

    cluster.resume(reclaimed.zombie)

    rejected = wait_for_rejection(job.pk, 1, {"token_write"})
    assert (rejected.attempt_current, rejected.resource) == (2, "demo.Report")
    after = wait_for_state(job.pk, "succeeded")
    assert (after.attempt, after.result["attempt"]) == (2, 2)
    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == (
        f"job {job.pk} attempt 2",
        job.pk,
        2,
    )
    names = set(Report.objects.values_list("name", flat=True))
    # the zombie's own row went with it
    assert names == ({"shared"} if write_only else {"shared", "shared by attempt 2"})
    wait_until(
        lambda: "token_write rejected" in cluster.log(),
        timeout=10,
        what="the zombie's refusal to be logged",
        job_id=job.pk,
    )
    assert Job.objects.get(pk=job.pk).error == ""


def test_a_zombie_stopped_before_its_transaction_commits_inserts_nothing(start_qcluster):
    # Its handler only inserts (ctx.fenced_create), while attempt 1 still owns the job: nothing
    # blocks attempt 2, and the resumed zombie's COMMIT is refused by the INSERT's deferred check.
    # Without it the zombie's row would land: the INSERT's own check passed.
    cluster = start_qcluster()
    job = enqueue(
        "test.token_write_in_transaction",
        {
            "report": "own",
            "create_only": True,
            "seconds_by_attempt": {"1": FIRST_SECONDS, "2": 0.1},
        },
    )
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)
    after = wait_for_state(job.pk, "succeeded")
    assert after.attempt == 2
    wait_for_db_clock_past(job.pk, reclaimed.paused_at, FIRST_SECONDS)

    cluster.resume(reclaimed.zombie)

    rejected = wait_for_rejection(job.pk, 1, {"token_write"})
    assert (rejected.attempt_current, rejected.resource) == (2, "demo.Report")
    rows = Report.objects.values_list("name", "fence_attempt")
    assert list(rows) == [("own by attempt 2", 2)]
