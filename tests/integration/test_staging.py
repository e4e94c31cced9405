"""Staged outputs: attempt-scoped paths, promotion by the fenced commit, a losing worker deleting
its own outputs, and the orphan janitor (never a committed output, safe twice at once)."""

import io
import re
import threading
import time
from pathlib import Path

import pytest
from django.core.files import File
from django.core.files.base import ContentFile
from django.db import connection

import jobs
from jobs.context import Held, JobContext
from jobs.core import transitions
from jobs.core.exceptions import InvalidOption
from jobs.effects import janitor, staging
from jobs.models import Attempt, Job, JobEvent, StagedOutput
from jobs.worker import completer
from jobs.worker.heartbeat import Finished
from tests.integration.attempts import claim, expire_and_reap

pytestmark = pytest.mark.django_db(transaction=True)

A, B = "host-a:1", "host-b:2"


@pytest.fixture
def media(settings, tmp_path: Path) -> Path:
    settings.MEDIA_ROOT = str(tmp_path)
    return tmp_path


def _age_outputs(seconds: float) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE jobs_stagedoutput SET created_at = created_at - make_interval(secs => %s)",
            [seconds],
        )


def test_the_commit_points_the_job_at_the_committing_attempts_outputs(media):
    job = jobs.enqueue("test.echo")
    running = claim(A)
    ref = running.ctx.stage("report.csv", b"a,b\n1,2\n")
    assert ref == f"jobs/{job.pk}/attempt-1/report.csv"
    assert (media / ref).read_bytes() == b"a,b\n1,2\n"
    running.commit({"ok": True})
    job.refresh_from_db()
    assert job.result_ref == f"jobs/{job.pk}/attempt-1/"
    assert Attempt.objects.get(job=job, number=1).staging_ref == job.result_ref


def test_a_batch_commit_points_each_job_at_its_own_attempts_outputs(media):
    staged = jobs.enqueue("test.echo")
    claim(A).ctx.stage("out.txt", "attempt 1")  # its worker vanishes: attempt 2 is next
    expire_and_reap(staged.pk)
    bare = jobs.enqueue("test.echo")
    claimed = {c.fence.job_id: c for c in transitions.claim(B, limit=2, lease_seconds=30)}
    assert {(c.fence.job_id, c.fence.attempt) for c in claimed.values()} == {
        (staged.pk, 2),
        (bare.pk, 1),
    }
    held = {pk: Held(c.fence, 30) for pk, c in claimed.items()}
    JobContext(held[staged.pk], "test.echo", {}).stage("out.txt", "attempt 2")

    completer.commit([Finished(held[pk], c, pk, time.monotonic()) for pk, c in claimed.items()])

    # One statement, each row its own: the stager's attempt-2 prefix, nothing for the other.
    staged.refresh_from_db()
    bare.refresh_from_db()
    assert (staged.state, staged.result_ref) == ("succeeded", f"jobs/{staged.pk}/attempt-2/")
    assert (bare.state, bare.result_ref) == ("succeeded", "")
    assert Attempt.objects.get(job=staged, number=2).staging_ref == staged.result_ref
    assert Attempt.objects.get(job=bare, number=1).staging_ref == ""


def test_a_zombie_whose_commit_is_rejected_deletes_its_own_outputs(media):
    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    zombie_ref = zombie.ctx.stage("out.txt", "zombie")
    expire_and_reap(job.pk)
    winner = claim(B)
    winner_ref = winner.ctx.stage("out.txt", "winner")
    winner.commit("winner")

    zombie.commit("zombie")  # rejected: zero rows

    assert not (media / zombie_ref).exists()
    assert (media / winner_ref).read_text() == "winner"
    job.refresh_from_db()
    assert job.result_ref == f"jobs/{job.pk}/attempt-2/"
    statuses = dict(StagedOutput.objects.filter(job=job).values_list("attempt", "status"))
    assert statuses == {1: "discarded", 2: "staged"}


def test_a_failed_attempts_outputs_are_deleted_by_its_worker(media):
    jobs.enqueue("test.echo")
    running = claim(A)
    ref = running.ctx.stage("partial.bin", b"\x00\x01")
    running.fail("handler raised")
    assert not (media / ref).exists()
    assert StagedOutput.objects.get().status == "discarded"


def test_a_rejected_fail_never_deletes_the_outputs_its_own_attempts_commit_promoted(media):
    """Whatever made one worker present a fail after its own commit landed (a timeout racing
    the handler's return, a commit error blamed on the handler), result_ref keeps naming files
    that exist: the fail is rejected and recorded, the outputs stay."""
    job = jobs.enqueue("test.echo")
    running = claim(A)
    ref = running.ctx.stage("out.txt", "the result")
    running.commit({"ok": True})

    running.fail("a late failure of the same attempt")  # rejected: the job is over

    job.refresh_from_db()
    assert (job.state, job.result_ref) == ("succeeded", f"jobs/{job.pk}/attempt-1/")
    assert (media / ref).read_text() == "the result"
    assert StagedOutput.objects.get().status == "staged"  # promoted by the janitor later
    assert Attempt.objects.get(job=job).outcome == "succeeded"


@pytest.mark.parametrize("name", ["", "../etc", "a/b", ".hidden", "x\x00y", "n" * 201, 7])
def test_a_hostile_output_name_is_refused_before_anything_is_written(media, name):
    jobs.enqueue("test.echo")
    running = claim(A)
    with pytest.raises(ValueError):
        running.ctx.stage(name, b"x")
    assert not StagedOutput.objects.exists()
    assert list(media.iterdir()) == []


class _Unsized:
    """A stream with neither size, name nor seek (a pipe, a socket's reader)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._data.read(n)


@pytest.mark.parametrize(
    "content",
    [
        lambda n: b"x" * n,
        lambda n: "x" * n,
        lambda n: ContentFile(b"x" * n),
        lambda n: io.BytesIO(b"x" * n),
        lambda n: File(_Unsized(b"x" * n)),  # a size Django cannot tell: read, bounded
    ],
    ids=["bytes", "str", "file", "readable", "file of unknown size"],
)
def test_an_output_over_the_size_limit_is_refused_before_anything_is_written(
    media, monkeypatch, content
):
    assert staging.MAX_BYTES == 1024**3  # the documented bound: 1 GiB
    monkeypatch.setattr(staging, "MAX_BYTES", 8)
    job = jobs.enqueue("test.echo")
    running = claim(A)
    with pytest.raises(InvalidOption, match="9 bytes is more than 8"):
        running.ctx.stage("big.bin", content(9))
    assert not StagedOutput.objects.exists()
    assert list(media.iterdir()) == []

    ref = running.ctx.stage("big.bin", content(8))  # at the bound: staged
    assert (media / ref).read_bytes() == b"x" * 8
    assert StagedOutput.objects.get(job=job).size == 8


def _outputs_of_killed_and_committed_attempts(media: Path) -> tuple[Job, str, str]:
    """Attempt 1 stages and its worker vanishes (expired); attempt 2 stages and commits."""
    job = jobs.enqueue("test.echo")
    killed = claim(A)
    orphan = killed.ctx.stage("out.txt", "attempt 1")
    expire_and_reap(job.pk)
    winner = claim(B)
    kept = winner.ctx.stage("out.txt", "attempt 2")
    winner.commit("ok")
    return job, orphan, kept


def test_the_janitor_deletes_an_orphan_after_the_grace_period_and_never_a_committed_output(
    media, settings
):
    settings.JOBS = {**settings.JOBS, "ORPHAN_GRACE_SECONDS": 60}
    job, orphan, kept = _outputs_of_killed_and_committed_attempts(media)
    assert janitor.sweep("janitor:1") == 0  # inside the grace period: nothing
    assert (media / orphan).exists()

    _age_outputs(61)
    assert janitor.sweep("janitor:1") == 1

    assert not (media / orphan).exists()
    assert (media / kept).read_text() == "attempt 2"
    statuses = dict(StagedOutput.objects.filter(job=job).values_list("attempt", "status"))
    assert statuses == {1: "orphaned", 2: "promoted"}
    event = JobEvent.objects.get(job=job, type="orphaned")
    assert (event.attempt, event.data["path"]) == (1, orphan)
    assert janitor.sweep("janitor:1") == 0  # settled rows are never looked at again


def test_the_janitor_leaves_an_attempt_that_is_still_running_even_past_its_lease(media, settings):
    settings.JOBS = {**settings.JOBS, "ORPHAN_GRACE_SECONDS": 0}
    job = jobs.enqueue("test.echo")
    running = claim(A)
    ref = running.ctx.stage("out.txt", "late but mine")
    with connection.cursor() as cur:  # the lease ran out, but nobody reclaimed the job yet
        cur.execute(
            "UPDATE jobs_job SET lease_expires_at = clock_timestamp() - interval '1 minute' "
            "WHERE id = %s",
            [job.pk],
        )
    _age_outputs(3600)
    assert janitor.sweep("janitor:1") == 0
    running.commit("late commit, still accepted")  # nobody else owned the job
    assert (media / ref).exists()
    assert Job.objects.get(pk=job.pk).result_ref == f"jobs/{job.pk}/attempt-1/"


def test_two_janitors_at_once_settle_each_orphan_exactly_once(media, settings):
    settings.JOBS = {**settings.JOBS, "ORPHAN_GRACE_SECONDS": 0}
    for _ in range(6):
        _outputs_of_killed_and_committed_attempts(media)
    _age_outputs(10)
    found: list[int] = []
    barrier = threading.Barrier(2)

    def sweep(name: str) -> None:
        try:
            barrier.wait(5)
            found.append(janitor.sweep(name, limit=3))
            found.append(janitor.sweep(name, limit=3))
            found.append(janitor.sweep(name, limit=3))
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep, args=(f"janitor:{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(found) == 6
    assert JobEvent.objects.filter(type="orphaned").count() == 6
    assert StagedOutput.objects.filter(status="promoted").count() == 6


def test_staging_a_name_twice_in_one_attempt_replaces_the_first_file(media):
    job = jobs.enqueue("test.echo")
    running = claim(A)
    first = running.ctx.stage("out.txt", "first")
    ref = running.ctx.stage("out.txt", "second, longer")
    # Written beside the first under a fresh name (out~<7 random>.txt), then the first deleted.
    assert ref != first and ref.startswith(f"jobs/{job.pk}/attempt-1/out~")
    assert (media / ref).read_text() == "second, longer"
    assert [p.name for p in (media / f"jobs/{job.pk}/attempt-1").iterdir()] == [Path(ref).name]
    row = StagedOutput.objects.get(job=job)
    assert (row.path, row.size) == (ref, len("second, longer"))


def test_a_restage_on_a_storage_that_overwrites_takes_a_name_no_handler_can_stage(
    settings, tmp_path
):
    # A storage that overwrites (S3's default; FileSystemStorage(allow_overwrite=True)) writes
    # each name where it is told. Before: the fresh name came from the storage's
    # get_alternative_name(), which FileSystemStorage(allow_overwrite=True) answers with the
    # name itself -- the re-stage looped for good, at full CPU; and its form, `<stem>_<7
    # random><ext>`, is a name a handler may stage too (the basename of its ref, say), whose
    # file would then overwrite the replacement.
    settings.STORAGES = {
        **settings.STORAGES,
        "overwriting": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path), "allow_overwrite": True},
        },
    }
    settings.JOBS = {**settings.JOBS, "STAGING_STORAGE": "overwriting"}
    jobs.enqueue("test.echo")
    running = claim(A)
    running.ctx.stage("out.txt", "first")
    ref = running.ctx.stage("out.txt", "second")
    # The README's form: `<stem>~<7 random><ext>`, beside the first in the attempt's prefix.
    assert re.fullmatch(r"jobs/\d+/attempt-1/out~[A-Za-z0-9]{7}\.txt", ref), ref
    try:
        other = running.ctx.stage(Path(ref).name, "another output")
    except InvalidOption:  # not a name a handler can stage: nothing to overwrite
        other = None
    running.commit("ok")
    out = StagedOutput.objects.get(name="out.txt")
    assert out.path == ref
    assert (tmp_path / ref).read_text() == "second"
    if other is not None:
        assert other != ref and (tmp_path / other).read_text() == "another output"


def test_the_janitor_reads_only_the_unsettled_rows_through_its_partial_index(media):
    from django.db.models import Exists, OuterRef
    from django.db.models.functions import Now

    with connection.cursor() as cur:  # a large settled history, a few unsettled rows
        job = jobs.enqueue("test.echo")
        cur.execute(
            "INSERT INTO jobs_stagedoutput (job_id, attempt, name, path, size, status, created_at) "
            "SELECT %s, 1, 'f' || g, 'p' || g, 0, 'promoted', now() "
            "FROM generate_series(1, 20000) g",
            [job.pk],
        )
        cur.execute("ANALYZE jobs_stagedoutput")
    running = Attempt.objects.filter(
        job_id=OuterRef("job_id"), number=OuterRef("attempt"), outcome="running"
    )
    query = (
        StagedOutput.objects.filter(status="staged", created_at__lt=Now())
        .exclude(Exists(running))
        .order_by("created_at", "id")[:200]
    )
    plan = query.explain()
    assert "jobs_staged_unsettled_idx" in plan, plan


def test_a_worker_whose_heartbeat_found_the_lease_gone_deletes_its_own_outputs(media):
    from jobs.core import transitions

    job = jobs.enqueue("test.echo")
    zombie = claim(A)
    ref = zombie.ctx.stage("out.txt", "zombie")
    expire_and_reap(job.pk)
    claim(B)
    with pytest.raises(jobs.LeaseLost):  # the beat changes zero rows
        transitions.heartbeat(zombie.held.fence, 30)
    zombie.held.lost.set()  # what the background heartbeat does on such a beat
    zombie.commit("never presented")
    assert not (media / ref).exists()
    assert StagedOutput.objects.get(attempt=1).status == "discarded"


def test_a_readable_object_is_staged_and_a_bad_content_type_refused(media):
    import io

    jobs.enqueue("test.echo")
    running = claim(A)
    ref = running.ctx.stage("stream.bin", io.BytesIO(b"streamed"))
    assert (media / ref).read_bytes() == b"streamed"
    for bad in [None, 12, object()]:
        with pytest.raises(ValueError):
            running.ctx.stage("bad.bin", bad)
    # Before: UnicodeEncodeError, from inside stage(), for text no file can hold as UTF-8.
    with pytest.raises(jobs.InvalidOption, match="lone surrogate"):
        running.ctx.stage("bad.txt", "text \ud800")
