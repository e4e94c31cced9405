"""A real zombie's token-checked write (`ctx.fenced_write`) against real `manage.py qcluster`
processes: stopped (SIGSTOP) past its lease before it writes, replaced by attempt 2 which writes
the row and commits, the row then written by another job, and resumed (SIGCONT). The row no
longer remembers the job's attempts; the job row still does, and refuses the zombie.

The zombie is resumed with `jobs_job` locked against heartbeats (`heartbeats_held_back`): its
heartbeat thread, resumed with it, would otherwise race the handler, and when it won it found the
lease gone and stopped the handler before its write reached the database (safe, but not the
refusal this test is about; it happened under load)."""

import pytest

from demo.models import Report
from jobs import enqueue
from jobs.models import Job
from tests.acceptance.cluster import (
    heartbeats_held_back,
    pause_first_attempt_until_reclaimed,
    wait_for_rejection,
    wait_for_state,
    wait_until,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

# Attempt 1's sleep before it writes: usually not run out when it is resumed, so its heartbeat
# thread certainly tries first -- the order that used to stop the handler before its write.
FIRST_SECONDS = 6.0


def test_a_zombies_token_write_is_refused_after_another_job_wrote_the_row(
    start_qcluster, second_connection
):
    cluster = start_qcluster()
    report = Report.objects.create(name="shared")
    job = enqueue(
        "test.token_write",
        {"report": "shared", "seconds_by_attempt": {"1": FIRST_SECONDS, "2": 0.2}},
    )
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk, before_first_beat=False)
    assert wait_for_state(job.pk, "succeeded").attempt == 2
    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == (
        f"job {job.pk} attempt 2",
        job.pk,
        2,
    )
    other = enqueue("test.token_write", {"report": "shared"})
    wait_for_state(other.pk, "succeeded")
    report.refresh_from_db()
    assert (report.fence_job_id, report.fence_attempt) == (other.pk, 1)  # J's token is gone

    with heartbeats_held_back(second_connection):
        cluster.resume(reclaimed.zombie)
        rejected = wait_for_rejection(job.pk, 1, {"token_write"})
    assert (rejected.attempt_current, rejected.state_current, rejected.resource) == (
        2,
        "succeeded",
        f"demo.Report:{report.pk}",
    )
    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == (
        f"job {other.pk} attempt 1",
        other.pk,
        1,
    )
    # The zombie stopped at the refusal: its work was discarded, the job is as attempt 2 left it.
    wait_until(
        lambda: "token_write rejected" in cluster.log(),
        timeout=10,
        what="the zombie's refusal to be logged",
        job_id=job.pk,
    )
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.attempt, after.result["attempt"]) == ("succeeded", 2, 2)
