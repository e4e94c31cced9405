"""A confirmation names an attempt ("attempt 3 is running on vm:1234; its later writes will be
refused"); if the job moves on to another attempt before the press lands, nothing is done. Decided
under the job's row lock, on two real sessions: a claim of attempt 4 in flight while the operator
confirms attempt 3 must not make the press take attempt 4 away -- on the dashboard and in the
admin, which now carries the attempt its confirmation named too."""

import threading
import time

import psycopg
import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.core.states import JobState
from jobs.models import Attempt, Job
from tests.concurrency.test_races import sessions  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_of_attempt_4_in_flight(s: psycopg.Connection, job: Job) -> None:
    """Attempt 3 expired and attempt 4 claimed by another worker, not yet committed."""
    s.execute(
        "UPDATE jobs_attempt SET outcome = 'expired', ended_at = now() WHERE job_id = %s", [job.pk]
    )
    s.execute(
        "UPDATE jobs_job SET attempt = 4, lease_expires_at = now() + interval '30 seconds' "
        "WHERE id = %s",
        [job.pk],
    )
    s.execute(
        "INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, outcome, error, "
        "staging_ref, heartbeat_gap_max) VALUES (%s, 4, 'vm:2', now(), 'running', '', '', 0)",
        [job.pk],
    )


def _wait_until_someone_waits_for_a_lock(observer: psycopg.Connection) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        row = observer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        ).fetchone()
        if row and row[0]:
            return
        time.sleep(0.01)
    raise AssertionError("the press never waited for the job's row lock")


@pytest.mark.parametrize("where", ["dashboard", "admin"])
@pytest.mark.parametrize("action", ["cancel", "requeue"])
def test_a_press_confirmed_for_attempt_3_leaves_attempt_4_running(
    make_job,
    sessions,  # noqa: F811
    where,
    action,
):
    user = User.objects.create_superuser("root", password="pw")
    job = make_job(state=JobState.RUNNING, attempt=3, worker="vm:1234")
    client = Client()
    client.force_login(user)
    url = (
        f"/jobs/{job.pk}/act/{action}/"
        if where == "dashboard"
        else (f"/admin/jobs/job/{job.pk}/act/{action}/")
    )
    confirmation = client.get(url).content.decode()
    assert "attempt 3 is running on vm:1234" in confirmation
    assert 'name="attempt" value="3"' in confirmation
    s1, _, observer = sessions
    _claim_of_attempt_4_in_flight(s1, job)
    answer: dict[str, str] = {}

    def press() -> None:
        from django.db import connection

        try:
            answer["text"] = client.post(url, {"attempt": 3}, follow=True).content.decode()
        finally:
            connection.close()

    t = threading.Thread(target=press)
    t.start()
    _wait_until_someone_waits_for_a_lock(observer)
    s1.commit()
    t.join(10)
    assert not t.is_alive()
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RUNNING, 4)
    assert Attempt.objects.get(job=job, number=4).outcome == "running"
    assert "changed since you looked (now attempt 4)" in answer["text"]
