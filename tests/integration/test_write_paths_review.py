"""Write paths of a running attempt found wanting in review, each proved against PostgreSQL."""

import time
from pathlib import Path

import pytest
from django.core.files.storage import FileSystemStorage
from django.db import connection, transaction

import jobs
from demo.models import Report
from jobs.models import Job, RejectedWrite, StagedOutput
from jobs.worker import completer
from jobs.worker.successes import Finished
from tests.integration.attempts import claim, expire_and_reap

pytestmark = pytest.mark.django_db(transaction=True)

A, B = "host-a:1", "host-b:2"

# -- ctx.stage inside the handler's own transaction -----------------------------------------------

STORAGE_LATENCY = 0.6  # seconds a write takes in SlowStorage: more than the deadline set below


class SlowStorage(FileSystemStorage):
    """A filesystem storage whose writes take as long as an upload of a large file to S3."""

    def _save(self, name: str, content: object) -> str:
        time.sleep(STORAGE_LATENCY)  # the latency under test, not a wait for a condition
        return super()._save(name, content)  # type: ignore[arg-type]


def test_a_stage_inside_the_handlers_transaction_may_take_longer_than_a_round_trips_deadline(
    settings, tmp_path: Path
):
    # Outside a transaction ctx.stage was never cut by the database deadline (a file may rightly
    # take longer to write); inside one, its side connection was cut mid-write and the stage
    # failed with "no answer within 0.2 s", its file written and its row left behind.
    settings.STORAGES = {
        **settings.STORAGES,
        "slow": {"BACKEND": f"{__name__}.SlowStorage", "OPTIONS": {"location": str(tmp_path)}},
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "slow", "DB_TIMEOUT_SECONDS": 0.2}
    job = jobs.enqueue("test.echo")
    owner = claim(A)
    with transaction.atomic():
        ref = owner.ctx.stage("out.txt", b"data")
    assert ref == f"jobs/{job.pk}/attempt-1/out.txt"
    assert (tmp_path / ref).read_bytes() == b"data"
    assert StagedOutput.objects.get(job=job).status == StagedOutput.Status.STAGED


# -- a batch whose lost attempt cannot be ended --------------------------------------------------


def test_a_lost_batch_mate_whose_end_cannot_be_written_does_not_drop_the_others_commit(
    second_connection,
):
    # The batch's successes are committed together; an attempt among them found lost is first
    # ended as lost. That end is one try: when the connection died under it (a restart, a
    # terminated backend) it raised, and the successes after it were never presented -- their
    # work dropped for the lease to decide -- though the commit itself re-reads and presents
    # again on a fresh connection. Now the successes go first and each discard on its own.
    first = jobs.enqueue("test.echo")
    second = jobs.enqueue("test.echo")
    lost, kept = claim(A), claim(A)
    assert {lost.claimed.fence.job_id, kept.claimed.fence.job_id} == {first.pk, second.pk}
    lost.held.lost.set()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        (pid,) = cur.fetchone()
    second_connection.execute("SELECT pg_terminate_backend(%s)", [pid])
    completer.commit(
        [
            Finished(lost.held, lost.claimed, None, time.monotonic()),
            Finished(kept.held, kept.claimed, {"ok": 1}, time.monotonic()),
        ]
    )
    job = Job.objects.get(pk=kept.claimed.fence.job_id)
    assert (job.state, job.result) == ("succeeded", {"ok": 1})


# -- ctx.fenced_write and the application's database routers --------------------------------------


class ReadsFromAReplica:
    """An application's router: reads go to a replica, writes to the primary (`default`)."""

    def db_for_read(self, model: type, **hints: object) -> str:
        return "replica"

    def db_for_write(self, model: type, **hints: object) -> None:
        return None


def test_a_token_checked_write_goes_where_the_routers_send_writes(settings):
    # Django's own update() writes through router.db_for_write; fenced_write took the queryset's
    # read alias: behind a read-replica router it locked, checked the job and wrote on the
    # replica (here an alias this install does not even have: ConnectionDoesNotExist).
    job = jobs.enqueue("test.echo")
    owner = claim(A)
    report = Report.objects.create(name="routed")
    settings.DATABASE_ROUTERS = [f"{__name__}.ReadsFromAReplica"]
    assert owner.ctx.fenced_write(Report.objects.filter(name="routed"), body="primary") == 1
    settings.DATABASE_ROUTERS = []
    report.refresh_from_db()
    assert (report.body, report.fence_job_id, report.fence_attempt) == ("primary", job.pk, 1)


# -- a token-checked write that matches no row --------------------------------------------------


def test_a_zombies_write_that_matches_no_row_is_refused_not_accepted():
    # A write matching no row was accepted whatever the job's state: a zombie was told 0 rows
    # updated, never LeaseLost, and a handler's upsert ("if not fenced_write(...): create(...)")
    # then created its stale row. The job check decides it alone now; the owner still gets 0.
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    expire_and_reap(job.pk)
    current = claim(B)
    nothing = Report.objects.filter(name="not there yet")
    assert current.ctx.fenced_write(nothing, body="attempt 2") == 0
    with pytest.raises(jobs.LeaseLost):
        zombie.ctx.fenced_write(nothing, body="attempt 1")
    assert zombie.held.lost.is_set()
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        "token_write",
        1,
        2,
    )
