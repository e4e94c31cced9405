"""An operator's write racing a worker's on the same row, on two real sessions: whichever the
database orders first wins, the other changes nothing (the second provably blocked)."""

import threading

import pytest
from django.db import connection, transaction

from jobs.core import transitions
from jobs.core.sql import CommitRow, PostgresDriver
from jobs.core.states import JobState
from jobs.models import Attempt
from tests.concurrency.test_races import sessions, wait_until_blocked  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_commit_that_lands_first_is_never_overwritten_by_a_requeue(make_job, sessions):  # noqa: F811
    job = make_job(state=JobState.RUNNING, attempt=1, worker="worker-a:1")
    s1, _, observer = sessions
    assert PostgresDriver().commit(s1.cursor(), "worker-a:1", [CommitRow(job.pk, 1, "done", "")])
    result: dict[str, object] = {}
    pid: list[int] = []

    def operator() -> None:
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                pid.append(cur.fetchone()[0])
            result["r"] = transitions.requeue(job.pk, "ops (race)")
        finally:
            connection.close()

    t = threading.Thread(target=operator)
    t.start()
    while not pid:
        t.join(0.01)
    wait_until_blocked(observer, pid[0])
    s1.commit()
    t.join(10)
    r = result["r"]
    assert not r.changed and "succeeded" in r.reason  # type: ignore[attr-defined]
    job.refresh_from_db()
    assert (job.state, job.result) == ("succeeded", "done")


def test_a_worker_commit_after_a_requeue_changes_nothing(make_job, sessions):  # noqa: F811
    job = make_job(state=JobState.RUNNING, attempt=1, worker="worker-a:1")
    _, s2, observer = sessions
    committed: list[set[int]] = []
    with transaction.atomic():  # holds the requeue's row lock until this block commits
        assert transitions.requeue(job.pk, "ops (race)").changed

        def worker() -> None:
            committed.append(
                PostgresDriver().commit(s2.cursor(), "worker-a:1", [CommitRow(job.pk, 1, "x", "")])
            )
            s2.commit()

        t = threading.Thread(target=worker)
        t.start()
        wait_until_blocked(observer, s2.info.backend_pid)
    t.join(10)
    assert committed == [set()]
    job.refresh_from_db()
    assert (job.state, job.attempt, job.result) == ("queued", 1, None)
    assert Attempt.objects.get(job=job, number=1).outcome == "requeued"
