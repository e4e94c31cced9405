"""Staged outputs: files an attempt writes under its own path, promoted only by its commit.

Owns: `ctx.stage(name, content)` -- recording a StagedOutput row, then writing the file through
Django's storage API (`JOBS["STAGING_STORAGE"]`, a key of `STORAGES`) at
`jobs/<job_id>/attempt-<n>/<name>` (a re-stage of the name: beside it, under a fresh name
`<stem>~<7 random><ext>` the row then moves onto) -- and a worker deleting its own outputs once
its attempt ends without committing (a rejected commit, a lost lease, a failure) -- never the
outputs of an attempt whose commit landed, but for a file written after it (`written_too_late`).

Never: promotes anything itself. The fenced commit sets `Job.result_ref` to the attempt's
prefix in the statement that ends the attempt; a zombie's commit changes zero rows, so
`result_ref` only ever names output of the attempt that committed (invariant 5).

Hazards: the row is written before the file, so a crash between the two leaves a row the janitor
settles (jobs/effects/janitor.py) rather than a file nobody knows about. If the janitor settled the
row while this worker was stalled before writing the file, the worker deletes what it just wrote.
A re-stage never touches the earlier file before the database has moved the row off it
(`_replace`); its new file is named by a spare row from before it is written, so a failed write, a
delete the storage refuses or a worker dying mid-way leaves the janitor a row for every file.
Storage errors while discarding are logged and left to the janitor: they never stop a drain.
"""

import logging
import os
import re
from typing import Any, NamedTuple

from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.functions import Now
from django.utils.crypto import get_random_string

from jobs.core.conf import jobs_settings
from jobs.core.exceptions import AttemptEnded, InvalidOption
from jobs.core.states import AttemptOutcome, JobState
from jobs.core.transitions import Fence
from jobs.models import Attempt, Job, StagedOutput

logger = logging.getLogger("jobs.staging")

# A plain file name: no directories, no "..", no NUL, nothing a storage backend might treat
# specially; the attempt-scoped directory is ours to choose.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
MAX_BYTES = 1024**3  # one staged output; larger content raises InvalidOption before any write


def storage() -> Storage:
    return storages[jobs_settings().STAGING_STORAGE]


def prefix(job_id: int, attempt: int) -> str:
    return f"jobs/{job_id}/attempt-{attempt}/"


def _checked_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
        raise InvalidOption(
            f"stage(): name {name!r:.80} must be 1-200 characters of letters, digits, '.', '_' "
            "or '-', starting with a letter or digit (no directories)"
        )
    return name


def _as_file(content: Any) -> "File[Any]":
    if isinstance(content, str):
        try:
            content = content.encode()
        except UnicodeEncodeError:
            raise InvalidOption("stage(): text holding a lone surrogate has no UTF-8") from None
    if isinstance(content, bytes | bytearray | memoryview):
        data = bytes(content)
        if len(data) > MAX_BYTES:
            raise InvalidOption(f"stage(): {len(data)} bytes is more than {MAX_BYTES}")
        return ContentFile(data)
    if isinstance(content, File):
        try:
            size = content.size
        except AttributeError:  # Django could not tell (no size, name or seek)
            size = None
        if size is not None:
            if size > MAX_BYTES:
                raise InvalidOption(f"stage(): {size} bytes is more than {MAX_BYTES}")
            return content
        # A size nobody knows is no bound: read it like any readable, below.
    if hasattr(content, "read"):  # any readable object: read at most one byte past the limit
        data = content.read(MAX_BYTES + 1)
        return _as_file(data) if isinstance(data, bytes | str) else _as_file(None)
    raise InvalidOption(f"stage(): content must be bytes, str or a file, not {type(content)}")


class Staged(NamedTuple):
    ref: str  # the storage name written
    replaced: bool  # it took the place of the attempt's earlier file of that name


def stage(fence: Fence, name: str, content: Any) -> Staged:
    """Write `content` as this attempt's output `name`; return its storage name (the ref).

    Staging the same name twice in one attempt replaces the first file -- while the attempt
    still runs, as the database decides (`_replace`): once its final write is decided the first
    file is kept and AttemptEnded raised.
    """
    name = _checked_name(name)
    file = _as_file(content)
    path = prefix(fence.job_id, fence.attempt) + name
    size = file.size or 0
    st = storage()
    try:  # one INSERT (one WAL flush) on the common path; the row exists before the file does
        with transaction.atomic():
            row = StagedOutput.objects.create(
                job_id=fence.job_id, attempt=fence.attempt, name=name, path=path, size=size
            )
    except IntegrityError:  # staged again in this attempt: replace the first file
        return Staged(_replace(fence, st, name, file, size), replaced=True)
    written = st.save(path, file)
    mine = StagedOutput.objects.filter(pk=row.pk, status=StagedOutput.Status.STAGED)
    if written != path:
        mine.filter(path=path).update(path=written)
    if not mine.filter(path=written).exists():  # settled (or replaced) while we wrote: undo it
        _undo(fence, st, written)
        logger.warning(
            "job %s attempt %s: output %s settled or replaced meanwhile", *_ids(fence), name
        )
    return Staged(written, replaced=False)


def _live(fence: Fence) -> QuerySet[StagedOutput]:
    """This attempt's `staged` rows while its job runs under it: decided by the database."""
    live = Job.objects.filter(pk=fence.job_id, attempt=fence.attempt, state=JobState.RUNNING)
    return StagedOutput.objects.filter(
        job_id=fence.job_id, attempt=fence.attempt, status=StagedOutput.Status.STAGED
    ).filter(Exists(live))


def _replace(fence: Fence, st: Storage, name: str, file: "File[Any]", size: int) -> str:
    """Write `file` under a fresh name, move the row onto it, then delete the earlier file.

    The row moves in one conditional UPDATE (still `staged`, still naming the file we read, the
    job still running under this attempt), so no commit lands between a check and a delete: a
    thread the handler left running may re-stage after the attempt committed, and the earlier
    file is then the committed result. Either the UPDATE comes first -- a commit promotes the
    row naming the new file, and the earlier one, named by no output, is deleted -- or the
    commit does, and the UPDATE changes nothing: the new file is deleted, the committed one
    kept. No lock is held across a storage call (it would stall every batch-mate's commit behind
    this job's storage). The fresh name is ours, not the storage's available name: a backend
    that overwrites (S3's default) would otherwise write over the committed file."""
    found = _live(fence).filter(name=name).values_list("path", "size").first()
    if found is None:  # settled, or the attempt is over: refused before writing anything
        raise AttemptEnded(fence.job_id, fence.attempt, "stage")
    current, current_size = found
    fresh = current
    while fresh == current:  # never the file the row names now (7 random characters: rare)
        fresh = _fresh(fence, name)
    # Row before file, as for any output: a spare row names the new file until the output's row
    # does, then the earlier file until it is deleted -- a crash anywhere leaves the janitor a
    # row for every file (a spare is never promoted: jobs/effects/janitor.py).
    spare = StagedOutput.objects.create(
        job_id=fence.job_id, attempt=fence.attempt, name=StagedOutput.spare_name(), path=fresh
    )
    written = st.save(fresh, file)  # raising, it leaves the spare row to the janitor
    if written != fresh:  # the storage chose another name (fresh was taken)
        StagedOutput.objects.filter(pk=spare.pk).update(path=written)
    while True:
        with transaction.atomic():  # two rows, no storage call: held for two statements
            moved = _live(fence).filter(name=name, path=current)
            if moved.update(path=written, size=size):
                spare_row = StagedOutput.objects.filter(pk=spare.pk)
                spare_row.update(path=current, size=current_size)
                break
        found = _live(fence).filter(name=name).values_list("path", "size").first()
        if found is None:  # the attempt ended first: its outputs stay as its commit found them
            _delete_spare(fence, st, spare.pk, written)
            raise AttemptEnded(fence.job_id, fence.attempt, "stage")
        current, current_size = found  # another thread of the handler moved the row first
    _delete_spare(fence, st, spare.pk, current)
    return written


def _fresh(fence: Fence, name: str) -> str:
    """`<stem>~<7 random><ext>` in the attempt's prefix: a name no handler can stage ('~' is not
    in NAME), so an output's file never lands on a replacement's, even on a storage that
    overwrites; and ours, not the storage's get_alternative_name(), which such a storage may
    answer with the name it was given (FileSystemStorage with allow_overwrite: a loop)."""
    root, ext = os.path.splitext(name)
    return f"{prefix(fence.job_id, fence.attempt)}{root}~{get_random_string(7)}{ext}"


def _delete_spare(fence: Fence, st: Storage, pk: int, path: str) -> None:
    """Delete the file a spare row names, then the row."""
    if _undo(fence, st, path, pk):
        StagedOutput.objects.filter(pk=pk).delete()


def _undo(fence: Fence, st: Storage, path: str, pk: int | None = None) -> bool:
    """Delete `path`, a file no output names (a spare's, or one written after its row was
    settled or moved on); whether it was. If the storage will not, the janitor deletes it: row
    `pk` (else a new spare row) is decided `orphaned`, its file not yet deleted -- the janitor
    retries such a delete whatever the attempt. Left as it was, the row may be `discarded` by the
    attempt's worker meanwhile, which the janitor never reads: the file would stay for good."""
    try:
        st.delete(path)
        return True
    except Exception:  # noqa: BLE001  any backend error: the janitor retries
        logger.exception("job %s attempt %s: could not delete %s", *_ids(fence), path)
    orphaned = StagedOutput.Status.ORPHANED
    if pk is None or not StagedOutput.objects.filter(pk=pk).update(
        status=orphaned, settled_at=None
    ):
        StagedOutput.objects.create(
            job_id=fence.job_id,
            attempt=fence.attempt,
            name=StagedOutput.spare_name(),
            path=path,
            status=orphaned,
        )
    return False


def written_too_late(fence: Fence, path: str) -> None:
    """`path` was written after its attempt's final write (by a thread the handler left running,
    the attempt ending while the file was written): its row is decided `orphaned`, so the janitor
    deletes the file and reports it. Even when the attempt committed: its commit promoted what
    its handler had staged, and a file landing in its prefix afterwards is not part of that.
    Not for a replacement of a name already staged (jobs/context.py): the database let it in
    while the attempt ran, so its row is what a commit landing after it promotes."""
    StagedOutput.objects.filter(
        job_id=fence.job_id, attempt=fence.attempt, path=path, status=StagedOutput.Status.STAGED
    ).update(status=StagedOutput.Status.ORPHANED)
    logger.warning("job %s attempt %s: %s written after the attempt ended", *_ids(fence), path)


def _ids(fence: Fence) -> tuple[int, int]:
    return fence.job_id, fence.attempt


def discard_own(fence: Fence) -> int:
    """Delete this attempt's staged outputs (its final write was not a commit); how many.

    Never those of an attempt whose own commit landed (its Attempt row `succeeded`, read in the
    same query): whatever made a later write of it rejected, `result_ref` names them."""
    deleted = 0
    st = storage()
    committed = Attempt.objects.filter(
        job_id=OuterRef("job_id"), number=OuterRef("attempt"), outcome=AttemptOutcome.SUCCEEDED
    )
    rows = StagedOutput.objects.filter(
        job_id=fence.job_id, attempt=fence.attempt, status=StagedOutput.Status.STAGED
    ).annotate(committed=Exists(committed))
    for row in rows:
        if row.committed:
            logger.error(
                "job %s attempt %s: committed, yet asked to discard its outputs: %s kept",
                *_ids(fence),
                row.path,
            )
            continue
        try:
            st.delete(row.path)
        except Exception:  # noqa: BLE001  any backend error: the janitor retries later
            logger.exception("job %s attempt %s: could not delete %s", *_ids(fence), row.path)
            continue
        # Still naming the file deleted: a re-stage whose UPDATE saw the attempt still running
        # may have moved the row meanwhile -- it stays `staged`, for the janitor to orphan.
        deleted += StagedOutput.objects.filter(
            pk=row.pk, status=StagedOutput.Status.STAGED, path=row.path
        ).update(status=StagedOutput.Status.DISCARDED, settled_at=Now())
    if deleted:
        logger.info("job %s attempt %s: deleted %s staged outputs", *_ids(fence), deleted)
    return deleted
