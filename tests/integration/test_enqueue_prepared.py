"""The enqueue statement is prepared once per connection and then costs one Bind/Execute
(jobs/models/prepared.py, one_statement.py), seen on the wire by libpq's own protocol trace of
the connection Django uses. Behind a transaction pooler it is never prepared:
tests/acceptance/test_enqueue_pooler.py, with a real PgBouncer."""

import gc
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

import jobs
from jobs.core import enqueue as enqueue_rules
from jobs.core.exceptions import InvalidOption
from jobs.core.states import EventType
from jobs.models import Job, JobEvent, one_statement


@contextmanager
def wire() -> Iterator[list[tuple[str, str]]]:
    """The messages this process sends PostgreSQL meanwhile, as (type, statement name or SQL):
    ("Parse", '"_pg3_0" "WITH ..."'), ("Bind", '"" "_pg3_0" ...'), ("Execute", ...),
    ("Sync", ""), ("Query", '"BEGIN"')."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[tuple[str, str]] = []
    with tempfile.TemporaryFile("w+") as log:
        pgconn.trace(log.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            log.seek(0)
            for line in log.read().splitlines():
                fields = line.split("\t")
                if fields[0] == "F":  # from the client; "B" lines are the server's answers
                    sent.append((fields[2], fields[3].strip() if len(fields) > 3 else ""))


def types(sent: list[tuple[str, str]]) -> list[str]:
    return [kind for kind, _ in sent]


@pytest.mark.django_db(transaction=True)
def test_after_its_first_call_an_enqueue_in_autocommit_is_one_bind_of_the_prepared_statement():
    jobs.enqueue("test.echo", {"warm": True})  # this connection prepares the statement once
    with wire() as sent:
        job = jobs.enqueue("test.echo", {"n": 1})
    # One round trip (one Sync), no Parse, no BEGIN/COMMIT: the statement's text is not sent.
    assert types(sent) == ["Bind", "Describe", "Execute", "Sync"], sent
    assert '"_pg3_' in sent[0][1], sent  # a named, prepared statement
    assert Job.objects.get(pk=job.pk).payload == {"n": 1}
    assert JobEvent.objects.filter(job=job, type=EventType.ENQUEUED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_first_enqueue_on_a_connection_prepares_and_checks_for_a_pooler_once():
    connection.close()
    with wire() as sent:
        jobs.enqueue("test.echo")
        jobs.enqueue("test.echo")
    assert types(sent) == [
        *["Query"],  # SELECT pg_backend_pid(): is this PostgreSQL itself? (jobs/models/prepared.py)
        *["Parse", "Sync"],
        *["Bind", "Describe", "Execute", "Sync"],
        *["Bind", "Describe", "Execute", "Sync"],
    ], sent
    assert "pg_backend_pid()" in sent[0][1]


@pytest.mark.django_db(transaction=True)
def test_inside_the_callers_transaction_each_enqueue_adds_one_execute_and_no_savepoint():
    jobs.enqueue("test.echo")
    jobs.enqueue("test.echo", unique_key="warm")  # the keyed statement is prepared too
    with wire() as sent:
        with transaction.atomic():
            first = jobs.enqueue("test.echo", unique_key="order-1")
            again = jobs.enqueue("test.echo", unique_key="order-1")
            jobs.enqueue("test.echo", {"after": "the duplicate"})
    assert types(sent).count("Execute") == 3 and types(sent).count("Parse") == 0, sent
    # The only simple queries are the caller's own BEGIN and COMMIT.
    assert [sql for kind, sql in sent if kind == "Query"] == ['"BEGIN"', '"COMMIT"'], sent
    assert again.duplicate and again.pk == first.pk
    assert Job.objects.count() == 4


@pytest.mark.django_db(transaction=True)
def test_with_enqueue_prepare_off_the_statement_is_sent_unnamed_in_one_round_trip():
    with override_settings(JOBS={"ENQUEUE_PREPARE": "off"}):
        jobs.enqueue("test.echo")
        with wire() as sent:
            job = jobs.enqueue("test.echo", {"n": 2})
    assert types(sent) == ["Parse", "Bind", "Describe", "Execute", "Sync"], sent
    assert sent[0][1].startswith('"" "WITH inserted AS'), sent  # the unnamed statement
    assert Job.objects.get(pk=job.pk).payload == {"n": 2}


@pytest.mark.django_db(transaction=True)
def test_prepared_statements_off_turns_the_enqueues_off_too_even_when_it_says_on():
    """One switch for a pooler that keeps no prepared statements: JOBS_PREPARED_STATEMENTS=0."""
    with override_settings(JOBS={"PREPARED_STATEMENTS": False, "ENQUEUE_PREPARE": "on"}):
        jobs.enqueue("test.echo")
        with wire() as sent:
            jobs.enqueue("test.echo", {"n": 3})
    assert types(sent) == ["Parse", "Bind", "Describe", "Execute", "Sync"], sent
    assert sent[0][1].startswith('"" "WITH inserted AS'), sent  # the unnamed statement


@pytest.mark.django_db(transaction=True)
def test_auto_does_not_prepare_where_the_database_disables_server_side_cursors(monkeypatch):
    """DISABLE_SERVER_SIDE_CURSORS is Django's own setting for a transaction pooler."""
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    jobs.enqueue("test.echo")
    with wire() as sent:
        jobs.enqueue("test.echo", {"n": 4})
    assert types(sent) == ["Parse", "Bind", "Describe", "Execute", "Sync"], sent
    assert sent[0][1].startswith('"" "WITH inserted AS'), sent  # the unnamed statement


@pytest.mark.django_db
def test_an_unknown_enqueue_prepare_setting_is_refused_with_its_choices():
    with (
        override_settings(JOBS={"ENQUEUE_PREPARE": "sometimes"}),
        pytest.raises(InvalidOption, match="'auto' \\(the default\\), 'on' or 'off'"),
    ):
        jobs.enqueue("test.echo")


@pytest.mark.django_db
def test_when_django_logs_queries_the_enqueue_goes_through_its_cursor_and_is_logged():
    with CaptureQueriesContext(connection) as captured:
        jobs.enqueue("test.echo")
    assert len(captured) == 1 and captured[0]["sql"].startswith("WITH inserted AS")


@pytest.mark.django_db
def test_the_payload_stored_from_the_checked_json_text_is_the_one_djangos_encoding_stores():
    payload = {
        "text": "é ü — 日本 🎉",
        "backslash-u0000 as text": "\\u0000",
        "quote": 'say "hi"',
        "nested": [1, 2.5, -0.0, 1e300, None, True, {"b": 2, "a": 1}],
        "big": 2**63 + 1,
        "percent": "100%s %%",
    }
    ours = jobs.enqueue("test.echo", payload)
    djangos = Job.objects.create(kind="test.echo", payload=payload)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT a.payload = b.payload, a.payload::text FROM jobs_job a, jobs_job b "
            "WHERE a.id = %s AND b.id = %s",
            [ours.pk, djangos.pk],
        )
        same, text = cur.fetchone()
    assert same, text
    # jsonb normalises numbers (1e300 comes back as an int, -0.0 as 0) whichever path wrote it
    stored = Job.objects.get(pk=djangos.pk).payload
    assert ours.payload == Job.objects.get(pk=ours.pk).payload == stored


@pytest.mark.django_db(transaction=True)
def test_the_enqueue_keeps_a_cursor_per_connection_and_thread():
    """Its cursor is kept (its adapters then know the statement's types: ~50 us of client CPU a
    call); a new connection gets a new one, and so does every thread."""
    jobs.enqueue("test.echo")
    kept = one_statement._LOCAL.cursors[DEFAULT_DB_ALIAS]
    assert kept.connection is connection.connection
    jobs.enqueue("test.echo", {"n": 1})
    assert one_statement._LOCAL.cursors[DEFAULT_DB_ALIAS] is kept
    connection.close()
    jobs.enqueue("test.echo", {"n": 2})
    assert one_statement._LOCAL.cursors[DEFAULT_DB_ALIAS] is not kept
    assert Job.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_closed_connection_is_not_kept_alive_by_its_enqueue_cursor():
    """A web process closes its connection after each request (CONN_MAX_AGE 0): the cursor kept
    for the old one must not keep it, and one per request pile up, in the thread."""
    jobs.enqueue("test.echo")
    old = weakref.ref(connection.connection)
    connection.close()
    jobs.enqueue("test.echo", {"n": 1})  # a new connection, its own cursor
    gc.collect()
    assert old() is None


@pytest.mark.django_db(transaction=True)
def test_threads_sharing_one_connection_each_get_their_own_job_back():
    """psycopg lets two threads use one connection in turn; between one thread's execute and
    its fetch the other's may run. A cursor shared by both would hand one the other's row (or
    none: with one shared cursor this race failed about every other run)."""
    shared = connections[DEFAULT_DB_ALIAS]
    shared.ensure_connection()
    shared.inc_thread_sharing()
    got: list[tuple[int, dict[str, object]]] = []
    cursors: dict[str, object] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def enqueue_many(name: str) -> None:
        try:
            start.wait()
            for i in range(500):
                row, text = enqueue_rules.checked("test.echo", {"by": name, "i": i})
                job = one_statement.enqueue(
                    Job, JobEvent, shared, row, enqueue_rules.UNIQUE_KEY_CONSTRAINT, text
                )
                got.append((job.pk, {"by": name, "i": i, "returned": job.payload}))
            cursors[name] = one_statement._LOCAL.cursors[DEFAULT_DB_ALIAS]
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=enqueue_many, args=(n,)) for n in ("a", "b")]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes, not every 5 ms
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
        shared.dec_thread_sharing()
    assert not errors, errors
    assert cursors["a"] is not cursors["b"]  # one connection, a cursor per thread
    stored = dict(Job.objects.values_list("pk", "payload"))
    assert len(got) == len(stored) == 1000
    for pk, seen in got:
        assert seen["returned"] == {"by": seen["by"], "i": seen["i"]} == stored[pk]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reset", ["DISCARD ALL", "DEALLOCATE ALL"])
def test_a_session_that_lost_its_statements_fails_enqueues_until_closed_unless_prepare_is_off(
    reset: str,
) -> None:
    """What prepared.py and docs/operations.md say: psycopg does not see a DISCARD ALL or
    DEALLOCATE ALL sent through Django's cursor, so outside a transaction every later enqueue on
    that connection fails until it is closed; with ENQUEUE_PREPARE off nothing is prepared and
    the reset changes nothing."""
    connection.close()
    jobs.enqueue("test.echo")  # prepared on this connection (direct: no pooler in the way)
    with connection.cursor() as cur:
        cur.execute(reset)
    for n in (1, 2):
        with pytest.raises(DatabaseError, match="does not exist"):
            jobs.enqueue("test.echo", {"n": n})
    connection.close()
    jobs.enqueue("test.echo", {"n": 3})  # a new connection prepares it again
    with override_settings(JOBS={"ENQUEUE_PREPARE": "off"}):
        with connection.cursor() as cur:
            cur.execute(reset)
        jobs.enqueue("test.echo", {"n": 4})
    payloads = list(Job.objects.order_by("pk").values_list("payload", flat=True))
    assert payloads == [{}, {"n": 3}, {"n": 4}]
