"""Retention: only old terminal jobs go, with their whole history, in batches, never blocking."""

import threading
import time

import pytest
from django.db import connection

import jobs
from jobs.core import transitions
from jobs.core.states import Write
from jobs.core.transitions import Fence
from jobs.effects import fenced, keys
from jobs.models import Attempt, IdempotencyKey, Job, JobEvent, RejectedWrite
from jobs.ops import retention


def age(job: Job, days: float) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_job SET finished_at = clock_timestamp() - make_interval(days => %s), "
            "updated_at = clock_timestamp() - make_interval(days => %s) "
            "WHERE id = %s",
            [days, days, job.pk],
        )


def with_history(job: Job) -> Job:
    Attempt.objects.create(
        job=job, number=1, worker="w:1", claimed_at=job.created_at, outcome="succeeded"
    )
    JobEvent.objects.create(job=job, attempt=1, type="claimed", worker="w:1")
    RejectedWrite.objects.create(
        job=job, attempt_presented=1, attempt_current=2, state_current="running", worker="w:1",
        write=Write.COMMIT,
    )  # fmt: skip
    IdempotencyKey.objects.create(key=f"{job.pk}:mail", job=job, step="mail", attempt=1)
    return job


@pytest.mark.django_db
def test_prune_deletes_only_old_terminal_jobs_and_all_their_history(make_job):
    old = [with_history(make_job(state=s)) for s in ("succeeded", "failed", "cancelled")]
    for job in old:
        age(job, 10)
    recent = with_history(make_job(state="succeeded"))
    age(recent, 2)
    queued = make_job(state="queued")
    running = make_job(state="running", attempt=1)

    assert retention.count(7) == 3
    report = retention.prune(7, batch_size=2)

    assert report.jobs == 3 and report.batches == 2
    left = set(Job.objects.values_list("pk", flat=True))
    assert left == {recent.pk, queued.pk, running.pk}
    for model in (Attempt, JobEvent, RejectedWrite, IdempotencyKey):
        assert not model.objects.filter(job_id__in=[j.pk for j in old]).exists(), model
    assert JobEvent.objects.filter(job=recent).exists()
    assert report.rows["jobs.Attempt"] == 3 and report.rows["jobs.JobEvent"] == 3


@pytest.mark.django_db(transaction=True)
def test_a_locked_row_is_skipped_not_waited_on(make_job, second_connection):
    held, free = make_job(state="succeeded"), make_job(state="succeeded")
    age(held, 30)
    age(free, 30)
    second_connection.execute("BEGIN")
    second_connection.execute("SELECT 1 FROM jobs_job WHERE id = %s FOR UPDATE", [held.pk])
    with connection.cursor() as cur:
        cur.execute("SET lock_timeout = '2s'")  # a wait would fail the test, not hang it
    try:
        report = retention.prune(7)
    finally:
        second_connection.execute("ROLLBACK")
        with connection.cursor() as cur:
            cur.execute("RESET lock_timeout")
    assert report.jobs == 1
    assert list(Job.objects.values_list("pk", flat=True)) == [held.pk]
    assert retention.prune(7).jobs == 1  # taken by the next run


@pytest.mark.django_db
def test_a_zombie_writing_to_a_pruned_job_is_rejected_quietly(make_job):
    job = make_job(state="succeeded", attempt=1)
    age(job, 30)
    retention.prune(7)
    with pytest.raises(transitions.LeaseLost):
        transitions.commit(Fence(job.pk, 1, "zombie:1"), {"late": True})
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not RejectedWrite.objects.exists()


@pytest.mark.parametrize(("days", "batch"), [(-1, 10), (1e9, 10), (7, 0), (7, 10**6)])
def test_out_of_range_arguments_are_refused(days, batch):
    with pytest.raises(ValueError, match="must be between"):
        retention.prune(days, batch_size=batch)


@pytest.mark.django_db
def test_the_cascade_is_one_statement_for_every_related_table_and_never_loads_a_job(make_job):
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from jobs.models import Intent, Schedule, StagedOutput

    old = [with_history(make_job(state="succeeded")) for _ in range(3)]
    for job in old:
        age(job, 10)
        StagedOutput.objects.create(job=job, attempt=1, name="out", path=f"p/{job.pk}",
                                    status="promoted", settled_at=timezone.now())  # fmt: skip
        Intent.objects.create(job=job, attempt=1, step="a", key=f"{job.pk}:a", target="webhook",
                              state="done", done_at=timezone.now())  # fmt: skip
    schedule = Schedule.objects.create(
        name="nightly", kind="test.echo", cron="0 3 * * *", next_at=timezone.now(), last_job=old[0]
    )
    plan = retention.sql_cascade()
    assert plan is not None and {t for _, t, _, _ in plan} >= {"jobs_attempt", "jobs_schedule"}

    with CaptureQueriesContext(connection) as queries:
        report = retention.prune(7)

    assert report.jobs == 3 and not Job.objects.filter(pk__in=[j.pk for j in old]).exists()
    for model in (Attempt, JobEvent, RejectedWrite, IdempotencyKey, StagedOutput, Intent):
        assert not model.objects.exists(), model
    schedule.refresh_from_db()
    assert schedule.last_job_id is None  # SET NULL, as Django's collector does
    statements = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN",)]
    # One batch (3 jobs < the batch size): the candidates, then one statement deleting from
    # every related table and the jobs. Django's collector would also load the jobs and delete
    # them in chunks of 100.
    statements = [s for s in statements if not s.startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) == 2, statements
    assert all(f'"{table}"' in statements[-1] for _, table, _, _ in plan), statements
    assert report.rows["jobs.Intent"] == 3 and report.rows["jobs.StagedOutput"] == 3
    assert not any('"jobs_job"."payload"' in s for s in statements)  # no job row is loaded


@pytest.mark.django_db
def test_a_delete_signal_listener_gets_django_s_collector(make_job):
    from django.db.models.signals import pre_delete

    seen: list[int] = []

    def listener(sender, instance, **kwargs):
        seen.append(instance.job_id)

    job = with_history(make_job(state="succeeded"))
    age(job, 10)
    pre_delete.connect(listener, sender=Attempt)
    try:
        assert retention.sql_cascade() is None
        assert retention.prune(7).jobs == 1
    finally:
        pre_delete.disconnect(listener, sender=Attempt)
    assert seen == [job.pk]
    assert retention.sql_cascade() is not None


@pytest.mark.django_db(transaction=True)
def test_a_job_keeps_its_unsettled_staged_outputs_until_the_janitor_deleted_the_files(
    settings, tmp_path, monkeypatch
):
    # Before: prune cascaded the StagedOutput rows away, the janitor's only record of the file,
    # and the orphan stayed in storage for ever.
    from jobs.effects import janitor
    from jobs.models import StagedOutput
    from tests.integration.attempts import claim, expire_and_reap

    settings.MEDIA_ROOT = str(tmp_path)
    settings.JOBS = {**settings.JOBS, "ORPHAN_GRACE_SECONDS": 0}
    job = jobs.enqueue("test.echo")
    killed = claim("host-a:1")
    orphan = killed.ctx.stage("out.txt", "attempt 1")  # its worker vanishes: staged, unsettled
    expire_and_reap(job.pk)
    claim("host-b:2").commit("ok")
    age(job, 10)
    assert retention.count(7) == 0 and retention.prune(7).jobs == 0

    storage = janitor.staging.storage()
    monkeypatch.setattr(type(storage), "delete", lambda self, name: 1 / 0)
    assert janitor.sweep("janitor:1") == 0  # decided orphaned; its file could not be deleted
    assert StagedOutput.objects.get(job=job).status == "orphaned"
    assert retention.prune(7).jobs == 0
    monkeypatch.undo()

    assert janitor.sweep("janitor:1") == 1  # deleted, settled: the job's history may go now
    assert not (tmp_path / orphan).exists()
    assert retention.prune(7).jobs == 1
    assert not StagedOutput.objects.exists()


@pytest.mark.django_db
def test_every_key_referencing_a_job_restricts_its_delete_without_the_no_action_recheck():
    """NO ACTION (Django's default) re-checks that the job's key is still present before the
    referencing table, for every pruned job and key: 60 % of the prune's time (migration 0026).
    A key added later, or one an AlterField recreated, must be RESTRICT again."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conrelid::regclass::text, confdeltype, condeferred FROM pg_constraint "
            "WHERE contype = 'f' AND confrelid = 'jobs_job'::regclass AND "
            "conrelid::regclass::text LIKE 'jobs\\_%%'"
        )
        keys = {table: (action, deferred) for table, action, deferred in cur.fetchall()}
    assert set(keys) == {"jobs_idempotencykey", "jobs_rejectedwrite", "jobs_intent",
                         "jobs_stagedoutput", "jobs_schedule"}  # fmt: skip
    # 'r': RESTRICT; an inserted referencing row is still checked at COMMIT, as Django declares.
    assert keys == {table: ("r", True) for table in keys}


@pytest.mark.django_db(transaction=True)
def test_a_raw_delete_of_a_referenced_job_is_refused_at_the_statement(make_job):
    """The keys keep refusing what they refused (a job with an undelivered intent deleted by
    hand), now at the DELETE itself, not at COMMIT; the inserting side still waits for COMMIT."""
    from django.db import IntegrityError, transaction

    from jobs.models import Intent

    job = make_job(state="succeeded")
    Intent.objects.create(job=job, attempt=1, step="a", key=f"{job.pk}:a", target="webhook")
    with pytest.raises(IntegrityError, match="jobs_intent"), transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("DELETE FROM jobs_job WHERE id = %s", [job.pk])
        pytest.fail("the DELETE itself was not refused")  # pragma: no cover
    assert Job.objects.filter(pk=job.pk).exists() and Intent.objects.filter(job=job).exists()
    with transaction.atomic():  # a referencing row before its job: checked at COMMIT, as before
        with connection.cursor() as cur:
            cur.execute("SELECT max(id) + 1000 FROM jobs_job")
            future = cur.fetchone()[0]
        Intent.objects.create(job_id=future, attempt=1, step="b", key="k-b", target="webhook")
        Intent.objects.filter(job_id=future).delete()


@pytest.mark.django_db
def test_the_job_table_is_vacuumed_unthrottled_and_only_it():
    """Migration 0027: stock autovacuum's throttle stretched jobs_job's runs over most of each
    minute under a stream, its dead rows slowing the claim. The other tables keep the server's."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relkind = 'r' AND relname IN "
            "('jobs_job', 'jobs_attempt', 'jobs_jobevent')"
        )
        options = dict(cur.fetchall())
    assert options == {
        "jobs_job": ["autovacuum_vacuum_cost_delay=0"],
        "jobs_attempt": None,
        "jobs_jobevent": None,
    }


def lock_waiters(conn) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")  # inside a transaction it is cached
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0])


def until_waiting(conn, count: int, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    while lock_waiters(conn) < count:
        assert time.monotonic() < deadline, f"never {count} sessions waiting for a lock"
        time.sleep(0.01)


def in_thread(fn) -> tuple[threading.Thread, list]:
    """Run fn on a thread of its own (its own Django connection); its result or exception."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 -- the test reads it
            out.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def token_write_refused(fence: Fence) -> None:
    """What a refused ctx.fenced_write (or effect) does: record it, raise LeaseLost."""
    fenced.record_rejection(fence, Write.TOKEN, "app.Note:1", None)
    raise transitions.LeaseLost(fence.job_id, fence.attempt, Write.TOKEN)


@pytest.mark.parametrize(
    "zombie",
    [
        pytest.param(lambda f: transitions.commit(f, {"late": True}), id="job-row-write"),
        pytest.param(lambda f: token_write_refused(f), id="token-write"),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_a_zombie_rejected_while_its_job_is_pruned_records_nothing_and_gets_lease_lost(
    make_job, second_connection, zombie
):
    """The zombie's rejection read the job (the prune's delete not yet committed) and inserted
    its rejected write; the foreign key's check at its COMMIT then waited for the prune and
    failed: an IntegrityError in the zombie, where a job already gone gives LeaseLost. Now the
    rejection holds the job row (FOR KEY SHARE) as it reads it: it waits for the prune, finds
    the job gone and records nothing."""
    job = make_job(state="succeeded", attempt=2)
    age(job, 30)
    for number in (1, 2):
        Attempt.objects.create(
            job=job, number=number, worker="w:1", claimed_at=job.created_at, outcome="expired"
        )
    # The prune waits mid-batch (the job locked, its cascade started) on an attempt row held here.
    second_connection.execute("BEGIN")
    second_connection.execute(
        "SELECT 1 FROM jobs_attempt WHERE job_id = %s AND number = 2 FOR UPDATE", [job.pk]
    )
    pruning, pruned = in_thread(lambda: retention.prune(7))
    try:
        until_waiting(second_connection, 1)
        rejecting, rejected = in_thread(lambda: zombie(Fence(job.pk, 1, "zombie:1")))
        until_waiting(second_connection, 2)  # the zombie waits for the prune
    finally:
        second_connection.execute("ROLLBACK")
    pruning.join(10)
    rejecting.join(10)
    assert pruned and pruned[0].jobs == 1, pruned
    assert rejected and isinstance(rejected[0], transitions.LeaseLost), rejected
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not RejectedWrite.objects.exists()
    assert not JobEvent.objects.filter(job_id=job.pk).exists()  # no orphaned history


class PausedEvents:
    """keys.JobEvent for one zombie: its event waits at `create` until the test lets it go (the
    zombie's process paused between its ledger statements, as SIGSTOP would)."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()
        self.objects = self

    def create(self, **fields):
        self.reached.set()
        assert self.go.wait(10), "never let go"
        return JobEvent.objects.create(**fields)


@pytest.mark.django_db(transaction=True)
def test_a_zombie_s_deduplicated_effect_leaves_no_event_for_a_job_the_prune_deletes(
    make_job, second_connection, monkeypatch
):
    """A zombie repeats a recorded effect (the key row done) while a prune batch takes its job:
    the zombie held the key row, the prune's one-statement cascade waited for it, and the
    zombie's `effect_deduplicated` event, committed meanwhile, was missed by that statement's
    snapshot -- an event left for a deleted job, which no later prune finds. The ledger now
    holds the job row (FOR KEY SHARE) before the key row: the prune skips the job."""
    job = make_job(state="succeeded", attempt=2)
    age(job, 30)
    IdempotencyKey.objects.create(
        key=f"{job.pk}:mail", job=job, step="mail", attempt=2, status="done", result=1
    )
    paused = PausedEvents()
    monkeypatch.setattr(keys, "JobEvent", paused)
    zombie, answered = in_thread(lambda: keys.begin(Fence(job.pk, 1, "zombie:1"), "mail"))
    assert paused.reached.wait(10)  # the zombie holds the key row
    pruning, pruned = in_thread(lambda: retention.prune(7))
    try:
        deadline = time.monotonic() + 10
        while pruning.is_alive() and not lock_waiters(second_connection):
            assert time.monotonic() < deadline, "the prune neither waited nor finished"
            time.sleep(0.01)
    finally:
        paused.go.set()
    pruning.join(10)
    zombie.join(10)
    assert answered and getattr(answered[0], "done", None) is True, answered
    assert pruned and not isinstance(pruned[0], BaseException), pruned
    events = set(JobEvent.objects.values_list("job_id", flat=True))
    assert events <= set(Job.objects.values_list("pk", flat=True)), "an event of a deleted job"
    retention.prune(7)  # the job goes with its event at the next batch
    assert not Job.objects.exists() and not JobEvent.objects.exists()
