import datetime as dt

import pytest
from django.db import connection, transaction
from django.utils import timezone

import jobs
from jobs.core.sql.queues import WAIT_SQL
from jobs.core.states import JobState
from jobs.models import Job, JobEvent

pytestmark = pytest.mark.django_db


def test_enqueue_returns_a_queued_job_with_its_options():
    run_at = timezone.now() + dt.timedelta(minutes=5)
    job = jobs.enqueue(
        "test.echo",
        {"a": 1},
        queue="mail",
        priority=5,
        run_at=run_at,
        max_attempts=4,
        lease_seconds=12,
    )
    job.refresh_from_db()
    assert (job.state, job.attempt, job.queue, job.priority) == (JobState.QUEUED, 0, "mail", 5)
    assert (job.payload, job.max_attempts, job.lease_seconds) == ({"a": 1}, 4, 12.0)
    assert job.run_at == run_at
    assert JobEvent.objects.filter(job=job, type="enqueued").exists()


def test_the_manager_enqueue_is_the_same_operation():
    job = Job.objects.enqueue("test.echo", {"b": 2})
    assert Job.objects.get(pk=job.pk).payload == {"b": 2}


def test_run_at_defaults_to_the_database_clock():
    job = jobs.enqueue("test.echo")
    with connection.cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        db_now = cur.fetchone()[0]
    job.refresh_from_db()
    assert abs((db_now - job.run_at).total_seconds()) < 5


@pytest.mark.parametrize(
    ("kind", "payload", "options", "error"),
    [
        ("no.such.kind", {}, {}, jobs.UnknownKind),
        ("test.echo\n", {}, {}, jobs.UnknownKind),  # no handler's name ("$" let one register)
        (123, {}, {}, jobs.InvalidOption),  # a kind is checked before it is looked up
        (None, {}, {}, jobs.InvalidOption),
        (["test.echo"], {}, {}, jobs.InvalidOption),  # was "unhashable type"
        (b"test.echo", {}, {}, jobs.InvalidOption),
        ("", {}, {}, jobs.InvalidOption),
        ("test." + "x" * 96, {}, {}, jobs.InvalidOption),  # Job.kind is varchar(100)
        ("test.echo\x00", {}, {}, jobs.InvalidOption),
        ("test.\ud800", {}, {}, jobs.InvalidOption),
        ("test.echo", {"when": dt.datetime(2026, 1, 1)}, {}, jobs.InvalidPayload),
        ("test.echo", {"x": float("nan")}, {}, jobs.InvalidPayload),
        ("test.echo", {"big": "x" * (256 * 1024)}, {}, jobs.PayloadTooLarge),
        ("test.echo", {}, {"queue": "bad queue!"}, jobs.InvalidQueue),
        ("test.echo", {}, {"queue": ""}, jobs.InvalidQueue),
        ("test.echo", {}, {"queue": "default\n"}, jobs.InvalidQueue),  # "$" let it through
        ("test.echo", {}, {"priority": "high"}, jobs.InvalidOption),
        ("test.echo", {}, {"priority": 10**6}, jobs.InvalidOption),
        ("test.echo", {}, {"priority": True}, jobs.InvalidOption),
        ("test.echo", {}, {"run_at": dt.datetime(2030, 1, 1)}, jobs.InvalidOption),
        ("test.echo", {}, {"max_attempts": 0}, jobs.InvalidOption),
        ("test.echo", {}, {"lease_seconds": -1}, jobs.InvalidOption),
        ("test.echo", {}, {"unique_key": ""}, jobs.InvalidOption),
    ],
)
def test_bad_input_raises_a_value_error_and_writes_nothing(kind, payload, options, error):
    with pytest.raises(error) as excinfo:
        jobs.enqueue(kind, payload, **options)
    assert isinstance(excinfo.value, ValueError)
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()


def test_a_duplicate_unique_key_returns_the_live_job():
    first = jobs.enqueue("test.echo", {"n": 1}, unique_key="invoice-7")
    second = jobs.enqueue("test.echo", {"n": 2}, unique_key="invoice-7")
    assert second.pk == first.pk
    assert (first.duplicate, second.duplicate) == (False, True)
    assert Job.objects.count() == 1


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.RUNNING])
def test_a_key_held_by_a_queued_or_running_job_returns_that_job_and_writes_nothing(make_job, state):
    holder = make_job(state=state, attempt=1, unique_key="invoice-8")
    events = JobEvent.objects.count()
    again = jobs.enqueue("test.echo", {"n": 2}, unique_key="invoice-8")
    assert (again.pk, again.duplicate, again.state) == (holder.pk, True, state)
    assert (Job.objects.count(), JobEvent.objects.count()) == (1, events)


def test_a_unique_key_is_free_again_once_its_job_is_terminal(make_job):
    done = make_job(state=JobState.SUCCEEDED, unique_key="report-1")
    again = jobs.enqueue("test.echo", unique_key="report-1")
    assert again.pk != done.pk


def test_a_duplicate_inside_the_callers_transaction_leaves_it_usable():
    with transaction.atomic():
        jobs.enqueue("test.echo", unique_key="k")
        jobs.enqueue("test.echo", unique_key="k")
        jobs.enqueue("test.echo", {"other": True})
    assert Job.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_enqueue_is_invisible_to_others_until_the_caller_commits(second_connection):
    def visible() -> int:
        return second_connection.execute("SELECT count(*) FROM jobs_job").fetchone()[0]

    with transaction.atomic():
        jobs.enqueue("test.echo")
        assert visible() == 0
    assert visible() == 1


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_leaves_no_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.enqueue("test.echo")
        raise RuntimeError("the caller changed its mind")
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_committed_enqueue_notifies_the_scheduler(second_connection):
    second_connection.execute(WAIT_SQL)  # a waiting process: enqueues notify it
    second_connection.execute("LISTEN jobs_enqueued")
    with transaction.atomic():
        jobs.enqueue("test.echo")
        assert list(second_connection.notifies(timeout=0.2)) == []
    received = list(second_connection.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in received] == ["jobs_enqueued"]


def test_a_key_whose_holders_keep_finishing_is_still_enqueued(second_connection):
    # READ COMMITTED: each try of the savepoint path met a holder that had ended by the time it
    # was read; five such holders in a row (fast jobs under one debounce key, many producers)
    # raised DuplicateJob, "this transaction cannot see it (REPEATABLE READ ...)".
    import threading
    import time

    from django.db import connection as django_connection

    from tests.conftest import raw_connection

    other = second_connection
    first = raw_connection(autocommit=False)
    insert = "INSERT INTO jobs_job (kind, unique_key) VALUES ('test.echo', 'K')"
    finish = (
        "UPDATE jobs_job SET state = 'cancelled', finished_at = now() "
        "WHERE unique_key = 'K' AND state = 'queued'"
    )
    # Each try of the savepoint path: its INSERT meets a live holder, which ends before its
    # SELECT looks for it; a new holder appears before the next INSERT -- 6 times in a row.
    churns = {"left": 6, "ended": False}

    def churn(execute, sql, params, many, context):
        if sql.startswith('INSERT INTO "jobs_job" (') and churns["ended"] and churns["left"]:
            other.execute(insert)
            churns["left"] -= 1
            churns["ended"] = False
        elif 'FROM "jobs_job" WHERE' in sql and '"unique_key" =' in sql:
            other.execute(finish)
            churns["ended"] = True
        return execute(sql, params, many, context)

    outcome: list = []

    def enqueue() -> None:
        try:
            with django_connection.execute_wrapper(churn):
                outcome.append(jobs.enqueue("test.echo", unique_key="K"))
        except Exception as exc:  # noqa: BLE001  reported below
            outcome.append(exc)
        finally:
            django_connection.close()

    try:
        first.execute(insert)  # a holder committed while the one statement waits on it
        thread = threading.Thread(target=enqueue)
        thread.start()
        deadline = time.monotonic() + 10
        waiting = (  # this database's sessions only: the server is shared with other suites
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        while other.execute(waiting).fetchone()[0] == 0:
            assert time.monotonic() < deadline, "the enqueue never waited on the first holder"
            time.sleep(0.01)
        first.commit()
        thread.join(30)
    finally:
        first.close()
    assert not thread.is_alive()
    (job,) = outcome
    assert isinstance(job, Job) and not job.duplicate, job
    assert Job.objects.filter(unique_key="K", state=JobState.QUEUED).get().pk == job.pk
    assert churns["left"] == 0  # every holder was met
