"""Staged outputs: files an attempt writes under its own path, promoted only by its commit.

Owns: `ctx.stage(name, content)` -- recording a StagedOutput row, then writing the file through
Django's storage API (`JOBS["STAGING_STORAGE"]`, a key of `STORAGES`) at
`jobs/<job_id>/attempt-<n>/<name>` -- and a worker deleting its own outputs once its attempt
ends without committing (a rejected commit, a lost lease, a failure) -- never the outputs of an
attempt whose commit landed, but for a file written after it (`written_too_late`).

Never: promotes anything itself. The fenced commit sets `Job.result_ref` to the attempt's
prefix in the statement that ends the attempt; a zombie's commit changes zero rows, so
`result_ref` only ever names output of the attempt that committed (invariant 5).

Hazards: the row is written before the file, so a crash between the two leaves a row the janitor
settles (jobs/effects/janitor.py) rather than a file nobody knows about. If the janitor settled the
row while this worker was stalled before writing the file, the worker deletes what it just wrote.
Storage errors while discarding are logged and left to the janitor: they never stop a drain.
"""

import logging
import re
from typing import Any

from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

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
        content = content.encode()
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


def stage(fence: Fence, name: str, content: Any) -> str:
    """Write `content` as this attempt's output `name`; return its storage name (the ref).

    Staging the same name twice in one attempt replaces the first file -- while the attempt
    still runs: once its final write is decided the first file is kept and AttemptEnded raised.
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
        row = StagedOutput.objects.get(job_id=fence.job_id, attempt=fence.attempt, name=name)
        if not _replaceable(fence, row.pk):  # its commit may have named it: never delete it
            raise AttemptEnded(fence.job_id, fence.attempt, "stage") from None
        st.delete(row.path)
    written = st.save(path, file)
    still = StagedOutput.objects.filter(pk=row.pk, status=StagedOutput.Status.STAGED)
    if written != row.path or row.size != size:
        still.update(path=written, size=size)
    if not still.exists():  # the janitor judged this attempt over while we wrote: undo it
        st.delete(written)
        logger.warning("job %s attempt %s: output %s was settled meanwhile", *_ids(fence), name)
    return written


def _replaceable(fence: Fence, pk: int) -> bool:
    """The earlier file may be deleted: its row is still `staged` and its attempt still runs.

    Decided in one query just before the delete: a thread the handler left running may reach a
    re-stage after the attempt committed (its in-memory check passed first), and the file it
    would replace is then the committed result (promoted, or about to be). A commit landing in
    the moment between this query and the delete is not excluded (holding the job row across a
    storage call would stall every batch-mate's commit behind this job's storage)."""
    live = Job.objects.filter(pk=fence.job_id, attempt=fence.attempt, state=JobState.RUNNING)
    return (
        StagedOutput.objects.filter(pk=pk, status=StagedOutput.Status.STAGED)
        .filter(Exists(live))
        .exists()
    )


def written_too_late(fence: Fence, path: str) -> None:
    """`path` was written after its attempt's final write (by a thread the handler left running,
    the attempt ending while the file was written): its row is decided `orphaned`, so the janitor
    deletes the file and reports it. Even when the attempt committed: its commit promoted what
    its handler had staged, and a file landing in its prefix afterwards is not part of that."""
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
        deleted += StagedOutput.objects.filter(pk=row.pk, status=StagedOutput.Status.STAGED).update(
            status=StagedOutput.Status.DISCARDED, settled_at=Now()
        )
    if deleted:
        logger.info("job %s attempt %s: deleted %s staged outputs", *_ids(fence), deleted)
    return deleted
