"""A real zombie's token-checked write (`ctx.fenced_write`) against real `manage.py qcluster`
processes: stopped (SIGSTOP) past its lease before it writes, replaced by attempt 2 which writes
the row and commits, the row then written by another job, and resumed (SIGCONT). The row no
longer remembers the job's attempts; the job row still does, and refuses the zombie."""

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

FIRST_SECONDS = 1.5  # attempt 1's sleep before it writes: run out by the time it is resumed


def test_a_zombies_token_write_is_refused_after_another_job_wrote_the_row(start_qcluster):
    cluster = start_qcluster()
    report = Report.objects.create(name="shared")
    job = enqueue(
        "test.token_write",
        {"report": "shared", "seconds_by_attempt": {"1": FIRST_SECONDS, "2": 0.2}},
    )
    reclaimed = pause_first_attempt_until_reclaimed(cluster, job.pk)
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
    wait_for_db_clock_past(job.pk, reclaimed.paused_at, FIRST_SECONDS)

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
