"""On PostgreSQL an enqueue is one statement: the job and its `enqueued` event in a
data-modifying CTE, the NOTIFY riding on the commit, a unique-key conflict answered without a
savepoint (jobs/core/sql/enqueue.py). The rules themselves are tested in test_enqueue.py."""

import re
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import jobs
from jobs.core import enqueue as enqueue_rules
from jobs.core.sql.queues import WAIT_SQL
from jobs.core.states import EventType, JobState
from jobs.models import Job, JobEvent
from tests.acceptance.cluster import wait_until
from tests.conftest import raw_connection


class Statements:
    """Every statement Django sends, with whether it ran in autocommit (no BEGIN, no COMMIT)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bool]] = []

    def __call__(self, execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        self.sent.append((sql, connection.get_autocommit()))
        return execute(sql, params, many, context)


def sent_while(action: Callable[[], Any]) -> tuple[Any, list[tuple[str, bool]]]:
    statements = Statements()
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(statements):
        result = action()
    assert len(captured) == len(statements.sent)
    return result, statements.sent


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_autocommit_is_one_statement_and_no_transaction_around_it():
    job, sent = sent_while(lambda: jobs.enqueue("test.echo", {"a": 1}))
    assert len(sent) == 1
    sql, autocommit = sent[0]
    assert autocommit  # so psycopg sent no BEGIN and no COMMIT: one round trip
    assert sql.startswith("WITH inserted AS (INSERT INTO jobs_job")
    assert Job.objects.filter(pk=job.pk, state=JobState.QUEUED).exists()


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_inside_the_callers_transaction_adds_one_statement_and_no_savepoint():
    with transaction.atomic():
        _, sent = sent_while(lambda: jobs.enqueue("test.echo", unique_key="order-1"))
        again, sent_again = sent_while(lambda: jobs.enqueue("test.echo", unique_key="order-1"))
        assert again.duplicate
        jobs.enqueue("test.echo")  # the conflict left the transaction usable
    assert (len(sent), len(sent_again)) == (1, 1)
    assert not any("SAVEPOINT" in sql for sql, _ in sent + sent_again)
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_the_enqueued_event_is_written_by_the_same_statement():
    job, sent = sent_while(lambda: jobs.enqueue("test.echo"))
    assert len(sent) == 1
    event = JobEvent.objects.get(job=job)
    assert (event.attempt, event.type, event.worker, event.data) == (0, EventType.ENQUEUED, "", {})


@pytest.mark.django_db
def test_a_duplicate_writes_no_second_event():
    first = jobs.enqueue("test.echo", unique_key="k")
    jobs.enqueue("test.echo", unique_key="k")
    assert JobEvent.objects.filter(job=first).count() == 1
    assert JobEvent.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.RUNNING])
def test_a_queued_or_running_holder_is_returned_by_the_one_statement(make_job, state):
    holder = make_job(state=state, attempt=1, unique_key="held")
    again, sent = sent_while(lambda: jobs.enqueue("test.echo", unique_key="held"))
    assert (again.pk, again.duplicate) == (holder.pk, True)
    assert len(sent) == 1 and sent[0][0].startswith("WITH inserted AS"), sent


@pytest.mark.django_db
def test_the_returned_job_is_a_job_with_every_field_as_stored():
    job = jobs.enqueue("test.echo", {"n": [1, 2]}, queue="mail", priority=3, unique_key="u-1")
    assert type(job) is Job and job.duplicate is False
    stored = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(stored, field.attname), field.name
    assert (job.state, job.attempt, job.kind, job.queue, job.priority) == (
        JobState.QUEUED,
        0,
        "test.echo",
        "mail",
        3,
    )
    assert job.payload == {"n": [1, 2]} and job.created_at is not None and job.run_at is not None
    duplicate = jobs.enqueue("test.echo", unique_key="u-1")
    assert type(duplicate) is Job and duplicate.duplicate is True
    for field in Job._meta.concrete_fields:
        assert getattr(duplicate, field.attname) == getattr(stored, field.attname), field.name


@pytest.mark.django_db
def test_the_statement_inserts_the_columns_djangos_own_insert_writes():
    """The column list comes from the model, not a list in the SQL: compare with Django's."""

    def columns(sql: str) -> set[str]:
        listed = re.search(r'INSERT INTO "?jobs_job"? \(([^)]*)\)', sql)
        assert listed, sql
        return {c.strip().strip('"') for c in listed.group(1).split(",")}

    row = enqueue_rules.fields("test.echo", {"x": 1}, unique_key="cols")
    _, django_insert = sent_while(lambda: Job.objects.create(**row))
    Job.objects.all().delete()
    _, ours = sent_while(lambda: jobs.enqueue("test.echo", {"x": 1}, unique_key="cols"))
    assert columns(ours[0][0]) == columns(django_insert[0][0])


# -- unique keys under concurrency: two connections ------------------------------------------


def blocked_on_a_lock(probe) -> bool:  # type: ignore[no-untyped-def]
    return bool(
        probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()[0]
    )


def enqueue_in_thread(results: dict[str, Any], **options: Any) -> threading.Thread:
    def run() -> None:
        try:
            statements = Statements()
            with connection.execute_wrapper(statements):
                results["job"] = jobs.enqueue("test.echo", **options)
            results["sent"] = [sql for sql, _ in statements.sent]
        except Exception as exc:  # noqa: BLE001 -- handed to the test, which fails on it
            results["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def holder_in_thread(commit: bool, held: threading.Event, release: threading.Event, out: dict):  # type: ignore[no-untyped-def]
    def run() -> None:
        try:
            with transaction.atomic():
                out["holder"] = jobs.enqueue("test.echo", unique_key="race")
                held.set()
                assert release.wait(timeout=20)
                if not commit:
                    transaction.set_rollback(True)
        finally:
            held.set()
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("holder_commits", [True, False], ids=["commits", "rolls-back"])
def test_two_enqueues_of_one_key_make_one_job(second_connection, holder_commits):
    held, release, holder, racer = threading.Event(), threading.Event(), {}, {}
    holding = holder_in_thread(holder_commits, held, release, holder)
    assert held.wait(timeout=20) and "holder" in holder
    racing = enqueue_in_thread(racer, unique_key="race")
    # The racer's insert waits on the holder's uncommitted row, in the index's uniqueness check.
    wait_until(
        lambda: blocked_on_a_lock(second_connection), timeout=20, what="racer waits", job_id=0
    )
    release.set()
    holding.join(timeout=20)
    racing.join(timeout=20)
    assert "error" not in racer, racer.get("error")
    live = list(Job.objects.filter(unique_key="race").values_list("pk", flat=True))
    assert len(live) == 1
    if holder_commits:
        assert (racer["job"].pk, racer["job"].duplicate) == (holder["holder"].pk, True)
        # The holder committed after the racer's statement began: its snapshot cannot see it,
        # so the statement returned nothing and the savepoint path (here in autocommit: its own
        # transaction) tried the insert again and read the holder.
        assert racer["sent"][0].startswith("WITH inserted AS"), racer["sent"]
        assert racer["sent"][1].startswith('INSERT INTO "jobs_job"'), racer["sent"]
        assert len(racer["sent"]) == 3 and "SELECT" in racer["sent"][2], racer["sent"]
    else:
        assert (racer["job"].pk, racer["job"].duplicate) == (live[0], False)
        assert len(racer["sent"]) == 1  # the insert went ahead once the holder was gone
    assert JobEvent.objects.filter(job_id=live[0], type=EventType.ENQUEUED).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_a_key_whose_holder_finishes_while_we_wait_goes_to_the_new_job(second_connection):
    holder = jobs.enqueue("test.echo", unique_key="handover")
    finishing = second_connection  # the holder's worker, committing it right now
    finishing.execute("BEGIN")
    finishing.execute(
        "UPDATE jobs_job SET state = 'succeeded', finished_at = now() WHERE id = %s", [holder.pk]
    )
    results: dict[str, Any] = {}
    racing = enqueue_in_thread(results, unique_key="handover")
    probe = raw_connection()
    try:
        wait_until(lambda: blocked_on_a_lock(probe), timeout=20, what="enqueue waits", job_id=0)
    finally:
        probe.close()
    finishing.execute("COMMIT")
    racing.join(timeout=20)
    assert "error" not in results, results.get("error")
    assert results["job"].pk != holder.pk and results["job"].duplicate is False
    assert Job.objects.get(unique_key="handover", state=JobState.QUEUED).pk == results["job"].pk


# -- isolation, rollback, wake-up ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
def test_under_repeatable_read_a_free_key_is_still_enqueued_and_a_visible_holder_returned(level):
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        first, sent = sent_while(lambda: jobs.enqueue("test.echo", unique_key="rr"))
        second, sent_again = sent_while(lambda: jobs.enqueue("test.echo", unique_key="rr"))
    assert (first.duplicate, second.duplicate, second.pk) == (False, True, first.pk)
    # ON CONFLICT could abort the transaction here: the key goes through a savepoint, while a
    # holder the snapshot sees is still returned by the one statement.
    assert any(sql.startswith("SAVEPOINT") for sql, _ in sent) and len(sent_again) == 1
    assert JobEvent.objects.filter(job=first).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_enqueue_leaves_neither_job_nor_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.enqueue("test.echo", unique_key="gone")
        raise RuntimeError("the caller changed its mind")
    assert not Job.objects.exists() and not JobEvent.objects.exists()
    assert jobs.enqueue("test.echo", unique_key="gone").duplicate is False


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_autocommit_notifies_a_listener_once_it_returns(second_connection):
    second_connection.execute(WAIT_SQL)  # a waiting process: enqueues notify it
    second_connection.execute("LISTEN jobs_enqueued")
    jobs.enqueue("test.echo")
    received = list(second_connection.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in received] == ["jobs_enqueued"]


# -- a keyless job: the database returns only what it decides ---------------------------------


def returned_columns(sql: str) -> list[str]:
    found = re.search(r" RETURNING (.*?)\), event AS", sql)
    assert found, sql
    return [c.strip().strip('"') for c in found.group(1).split(",")]


@pytest.mark.django_db
def test_a_keyless_statement_returns_only_what_the_database_decides():
    """The rest of the job is built from what was sent: parsing and planning 22 returned columns
    was about a third of an unprepared enqueue's server time (docs/benchmarks.md, 2026-12-06);
    the text is the same prepared or not."""
    _, sent = sent_while(lambda: jobs.enqueue("test.echo", {"a": 1}))
    _, sent_keyed = sent_while(lambda: jobs.enqueue("test.echo", unique_key="whole-row"))
    decided = ["id", "payload", "run_at", "deferred", "created_at", "updated_at"]
    assert returned_columns(sent[0][0]) == decided
    assert " VALUES (" in sent[0][0]
    # A keyed job may be the live holder, a row of its own: read back whole.
    assert returned_columns(sent_keyed[0][0]) == [f.column for f in Job._meta.concrete_fields]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"queue": "mail", "priority": -5, "max_attempts": 4, "lease_seconds": 2},
        {"run_at": "far"},  # deferred: set by the jobs_job_defer trigger, read back
        {"run_at": "past"},
    ],
    ids=["defaults", "options", "due-later", "due-earlier"],
)
def test_a_keyless_job_is_returned_with_every_field_as_stored(options):
    now = timezone.now()
    when = {"far": now + timedelta(hours=3), "past": now - timedelta(hours=3)}
    if "run_at" in options:
        options = {**options, "run_at": when[options["run_at"]]}
    payload = {"list": [1, (2, 3)], "float": 1.5, "text": "é\"'\\", "nested": {"b": None}}
    job = jobs.enqueue("test.echo", payload, **options)
    assert type(job) is Job and job.duplicate is False and job.pk is not None
    stored = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(stored, field.attname), field.name
    assert job.payload == {
        "list": [1, [2, 3]],
        "float": 1.5,
        "text": "é\"'\\",
        "nested": {"b": None},
    }
    assert job.deferred is (options.get("run_at") == when["far"])
    job.payload["list"].append(4)  # each job its own values: the next one is unchanged
    assert jobs.enqueue("test.echo", payload, **options).payload["list"] == [1, [2, 3]]
