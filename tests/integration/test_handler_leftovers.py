"""A handler that leaves the worker's connection unfit fails alone (jobs.worker.hygiene).

The handler shares Django's connection with the drain that runs it. One that returned with a
transaction open (a `transaction.atomic()` entered by hand, a raw BEGIN, autocommit off, a
failed statement caught inside its transaction) used to take the drain's next claims and
commits into that transaction, or make every later drain of the worker raise: its batch-mates
never committed. One that changed a reported session parameter (read-only transactions) made
every later claim of the worker refused.
"""

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

import jobs
from jobs.core.states import JobState
from jobs.models import Job
from jobs.worker import runner

pytestmark = pytest.mark.django_db(transaction=True)


def _marker() -> Job:
    """A job no drain claims (due in a year): the leaving handler writes to it."""
    return jobs.enqueue(
        "test.echo", unique_key="leftover-marker", run_at=timezone.now() + dt.timedelta(days=365)
    )


def _connection_is_clean() -> bool:
    connection.ensure_connection()
    status = int(connection.connection.pgconn.transaction_status)
    return not connection.in_atomic_block and connection.get_autocommit() and status == 0


@pytest.mark.parametrize("leave", ["atomic", "autocommit", "begin", "aborted"])
def test_a_transaction_left_open_fails_its_own_job_and_the_next_jobs_commit(leave):
    marker = _marker()
    leaving = jobs.enqueue("test.script", {"leave": leave}, max_attempts=1, priority=5)
    after = [jobs.enqueue("test.echo", {"n": n}) for n in range(3)]
    runner.drain(budget_seconds=20)
    leaving.refresh_from_db()
    assert leaving.state == JobState.FAILED
    assert "the handler returned" in leaving.error and "rolled back" in leaving.error
    for job in after:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, (leave, job.state, job.error)
    marker.refresh_from_db()
    assert marker.priority == 0  # the write made in the transaction left open did not stay
    assert _connection_is_clean()


def test_a_transaction_left_open_by_a_failing_handler_keeps_its_own_error():
    leaving = jobs.enqueue("test.script", {"leave": "begin", "raise": "boom"}, max_attempts=1)
    after = jobs.enqueue("test.echo")
    runner.drain(budget_seconds=20)
    leaving.refresh_from_db()
    after.refresh_from_db()
    assert leaving.state == JobState.FAILED
    assert "with a transaction open" in leaving.error and "boom" in leaving.error
    assert after.state == JobState.SUCCEEDED


def test_a_session_parameter_left_changed_costs_the_connection_not_the_job():
    changing = jobs.enqueue("test.script", {"leave": "read_only", "return": {"done": 1}})
    after = [jobs.enqueue("test.echo", {"n": n}) for n in range(3)]
    runner.drain(budget_seconds=20)
    changing.refresh_from_db()
    assert changing.state == JobState.SUCCEEDED and changing.result == {"done": 1}
    _succeeded_on_a_writable_connection(after)


def test_a_handler_run_on_a_thread_never_connected_is_not_taken_for_a_leftover():
    """Django's connection of a thread that has not connected yet reads autocommit=False."""
    import threading

    from django.db import connections

    from jobs.core import transitions
    from jobs.worker.heartbeat import Heartbeater

    job = jobs.enqueue("test.echo")
    batch = transitions.claim(runner.worker_identity(), limit=1, lease_seconds=30)

    def run() -> None:
        try:
            with Heartbeater(1.0, runner.completer.commit) as beats:
                runner.run_batch(batch, beats)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED, job.error


def test_an_alarm_a_handler_left_pending_never_goes_off_in_another_job():
    """`signal.alarm` as a handler's own deadline, not cancelled because it raised first: it
    went off in the next job, which failed with the first one's error."""
    import signal

    previous = signal.getsignal(signal.SIGALRM)
    outer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, if any: left alone
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        first = jobs.enqueue(
            "test.script", {"alarm": 0.5, "raise": "before its cancel"}, max_attempts=1, priority=5
        )
        second = jobs.enqueue("test.script", {"seconds": 1.5, "return": "mine"}, max_attempts=1)
        runner.drain(budget_seconds=20)
    finally:
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, *outer)
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.state == JobState.FAILED and "before its cancel" in first.error
    assert (second.state, second.result) == (JobState.SUCCEEDED, "mine"), second.error


def test_an_alarm_pending_before_the_handler_is_left_alone():
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    outer = signal.getitimer(signal.ITIMER_REAL)
    try:
        jobs.enqueue("test.echo")
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        runner.drain(budget_seconds=20)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # still pending: not the handler's
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer)
        signal.signal(signal.SIGALRM, previous)
    assert not fired


def test_an_alarm_set_between_two_drains_is_not_taken_for_the_next_handlers():
    """Whether an alarm is pending before a handler is what the drain's previous handler left
    (one system call a job): not across drains -- code between them (another django-q2 task)
    may set one, which the next drain's first handler did not."""
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    outer = signal.getitimer(signal.ITIMER_REAL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        jobs.enqueue("test.echo")
        assert runner.drain(budget_seconds=20) == 1  # its last handler left no alarm
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # not a handler's
        jobs.enqueue("test.echo")
        assert runner.drain(budget_seconds=20) == 1
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # still pending: left alone
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer)
        signal.signal(signal.SIGALRM, previous)
    assert not fired


@pytest.fixture
def other_alias(transactional_db, monkeypatch):
    """A second database alias (the same database), as a project with two would have."""
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    connections.settings["other"] = {**connection.settings_dict}
    # The test case's guard against unlisted aliases (django.test) is told of this one.
    patched = BaseDatabaseWrapper.ensure_connection
    cells = dict(zip(patched.__code__.co_freevars, patched.__closure__ or (), strict=True))
    case = cells["cls"].cell_contents
    monkeypatch.setattr(case, "databases", frozenset(case.databases) | {"other"})
    try:
        yield
    finally:
        other = connections["other"]
        other.in_atomic_block = other.closed_in_transaction = other.needs_rollback = False
        other.close()
        del connections["other"]
        del connections.settings["other"]


def test_a_transaction_left_open_on_another_alias_fails_its_own_job_only(other_alias):
    # Before: not looked at. The marker row stayed locked by the worker, and every later job
    # using that alias in the worker process ran inside the open transaction, never committed.
    from django.db import connections

    marker = _marker()
    leaving = jobs.enqueue("test.script", {"leave": "atomic_other"}, max_attempts=1, priority=5)
    after = jobs.enqueue("test.echo")
    runner.drain(budget_seconds=20)
    leaving.refresh_from_db()
    assert leaving.state == JobState.FAILED
    assert "database 'other'" in leaving.error and "rolled back" in leaving.error
    after.refresh_from_db()
    assert after.state == JobState.SUCCEEDED
    other = connections["other"]
    assert not other.in_atomic_block and other.get_autocommit()
    with other.cursor() as cursor:  # usable again, and the marker not locked
        cursor.execute("SET lock_timeout = '2s'")
        cursor.execute("UPDATE jobs_job SET priority = 1 WHERE id = %s", [marker.pk])
    marker.refresh_from_db()
    assert marker.priority == 1


def test_a_session_parameter_changed_on_a_connection_the_handler_reopened_is_seen_too():
    # The handler closed the worker's connection and changed a parameter on the new one: only
    # the connection the drain had before was compared. Its batch-mates' failures and the next
    # claims then ran read-only and were refused (the drain raised; leases decided them).
    changing = jobs.enqueue("test.script", {"leave": "read_only_reconnected"}, priority=5)
    failing = [jobs.enqueue("test.script", {"raise": f"own {n}"}, max_attempts=1) for n in range(3)]
    after = [jobs.enqueue("test.echo", {"n": n}) for n in range(3)]
    runner.drain(budget_seconds=20)
    changing.refresh_from_db()
    assert changing.state == JobState.SUCCEEDED
    for job in failing:
        job.refresh_from_db()
        assert job.state == JobState.FAILED and "own" in job.error, (job.state, job.error)
    _succeeded_on_a_writable_connection(after)


def _succeeded_on_a_writable_connection(after: list[Job]) -> None:
    """Every job of `after` succeeded, and the drain's connection is writable again."""
    for job in after:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED, (job.state, job.error)
    with connection.cursor() as cursor:
        cursor.execute("SHOW default_transaction_read_only")
        assert cursor.fetchone()[0] == "off"


def test_a_connection_lost_under_a_handler_is_not_taken_for_a_transaction_left_open():
    # It caught the error and returned: its result stands (nothing of it is left open anywhere).
    survived = jobs.enqueue("test.script", {"leave": "terminated", "return": {"done": 1}})
    # It raised: its own error is the job's, not "a transaction open" in front of it.
    raised = jobs.enqueue("test.script", {"leave": "terminated", "raise": "its own error"})
    after = [jobs.enqueue("test.echo", {"n": n}) for n in range(2)]
    runner.drain(budget_seconds=20)
    survived.refresh_from_db()
    raised.refresh_from_db()
    assert survived.state == JobState.SUCCEEDED and survived.result == {"done": 1}
    assert "its own error" in raised.error and "transaction open" not in raised.error
    _succeeded_on_a_writable_connection(after)
