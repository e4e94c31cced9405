"""Final writes a worker gave up resolving: a local spool, then a durable trace in the database.

Owns: the trace of the limit jobs.worker.completer sets on resolving an unknown outcome
(JOBS["UNKNOWN_OUTCOME_SECONDS"], 60 s). When the database stays unreachable past it, the worker
cannot write anything there, so `record` writes one small file per attempt to a local spool
(JOBS["UNRESOLVED_DIR"]). The embedded scheduler calls `resolve_pending` on every tick: once the
database answers and the attempt's outcome is decided (not `running`), it reads that outcome,
writes an `unresolved` event on the job (what was presented, when the worker gave up, what the
database says now), logs one line, and removes the file.

Never: guesses. The outcome in the event is read from the attempt row, the only record that
says whether this attempt's own write landed. An attempt still `running` is left in the spool
(its lease, or a late commit, decides it first).

Hazards: several databases may share one spool directory (the SQLite default and a PostgreSQL
URL on one checkout), so each entry names its database and only that database resolves it.
Two schedulers on one host may both see a file: the rename to `.resolving-<pid>` takes it. An
entry this code cannot read (valid JSON of the wrong shape, a value out of range) is moved to
`quarantine/` with one log line, so it never stops the scheduler nor hides the others. Each call
looks at a bounded number of files, resuming after the last one it looked at, so every entry is
reached however many others (other databases', undecided ones) sort before it. A new entry is
durable: the file is fsynced, then the folder after the rename.
"""

import json
import logging
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from jobs.core.conf import jobs_settings
from jobs.core.states import AttemptOutcome, EventType
from jobs.core.transitions import Fence
from jobs.models import Attempt, JobEvent

logger = logging.getLogger("jobs.unresolved")


def spool_dir() -> Path:
    configured = jobs_settings().UNRESOLVED_DIR
    return Path(configured) if configured else Path(settings.BASE_DIR) / "var" / "unresolved"


def _database() -> str:
    return f"{connection.vendor}:{connection.settings_dict.get('NAME')}"


def record(fences: Sequence[Fence], write: str) -> None:
    """Spool each attempt whose final write (`write`: the outcome it sets) stays unknown."""
    directory = spool_dir()
    limit = jobs_settings().UNKNOWN_OUTCOME_SECONDS
    for fence in fences:
        entry = {
            "database": _database(),
            "job_id": fence.job_id,
            "attempt": fence.attempt,
            "worker": fence.worker,
            "write": write,
            "gave_up_at": datetime.now(UTC).isoformat(),  # the worker's clock: for humans only
        }
        path = directory / f"job-{fence.job_id}-attempt-{fence.attempt}-{write}.json"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            with open(tmp, "w") as f:
                json.dump(entry, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_directory(directory)  # the rename itself survives a crash
            where = str(path)
        except OSError as exc:
            where = f"NOT spooled ({exc})"
        logger.error(
            "job %s attempt %s: outcome of its final write (%s) still unknown after %.0f s with "
            "the database unreachable; the lease decides the job; recorded in %s and reported "
            "once the database is back",
            fence.job_id,
            fence.attempt,
            write,
            limit,
            where,
        )


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


MAX_ENTRY_BYTES = 64 * 1024  # an entry is a few hundred bytes; anything larger is quarantined
# The name of the last file a call looked at: the next call resumes after it (per process).
_cursor = {"after": ""}


def resolve_pending(limit: int = 50) -> int:
    """Turn spooled entries of this database into `unresolved` events; return how many.

    Looks at no more than `limit` files per call, resuming after the previous call's last one
    (then from the start again), so entries of other databases or still undecided ones never
    hide the rest.
    """
    directory = spool_dir()
    try:
        names = sorted(p.name for p in directory.glob("job-*.json"))
    except OSError:
        return 0
    later = [n for n in names if n > _cursor["after"]]
    batch = (later + [n for n in names if n <= _cursor["after"]])[:limit]
    resolved = 0
    for name in batch:
        _cursor["after"] = name
        path = directory / name
        try:
            if path.stat().st_size > MAX_ENTRY_BYTES:
                raise ValueError("too large")  # not one of ours: never read whole
            entry = json.loads(path.read_text())
        except OSError:
            continue  # taken by another scheduler meanwhile
        except ValueError:
            entry = None  # not JSON (a torn write cannot happen: files are renamed in whole)
        if not isinstance(entry, dict):
            _quarantine(path, "not a JSON object")
            continue
        if entry.get("database") != _database():
            continue
        try:
            fence = _parse(entry)
        except (KeyError, TypeError, ValueError) as exc:
            _quarantine(path, f"{type(exc).__name__}: {exc}")
            continue
        if _resolve(path, entry, *fence):
            resolved += 1
    return resolved


def _parse(entry: dict[str, Any]) -> tuple[int, int, str]:
    """(job id, attempt, write) of an entry, checked; raises on anything this code did not write."""
    job_id, number, write = entry["job_id"], entry["attempt"], entry["write"]
    if type(job_id) is not int or type(number) is not int:
        raise TypeError(f"job_id and attempt must be integers, not {job_id!r}, {number!r}")
    if not (0 < job_id < 2**63 and 0 < number < 2**31):
        raise ValueError(f"job_id {job_id} or attempt {number} out of range")
    if write not in AttemptOutcome.values:
        raise ValueError(f"unknown write {str(write)[:50]!r}")
    return job_id, number, write


def _quarantine(path: Path, why: str) -> None:
    """Move an unreadable entry aside (kept for a human), with one log line."""
    target = path.parent / "quarantine" / path.name
    try:
        target.parent.mkdir(exist_ok=True)
        os.rename(path, target)
    except OSError:
        return  # taken by another scheduler meanwhile (or the folder is unwritable)
    logger.error("unresolved spool entry %s is malformed (%s): moved to %s", path, why, target)


def _resolve(path: Path, entry: dict[str, Any], job_id: int, number: int, write: str) -> bool:
    attempt = Attempt.objects.filter(job_id=job_id, number=number).first()
    if attempt is not None and attempt.outcome == AttemptOutcome.RUNNING:
        return False  # not decided yet: its lease or a late commit decides first
    taken = path.with_name(f"{path.name}.resolving-{os.getpid()}")
    try:
        os.rename(path, taken)
    except OSError:
        return False  # another scheduler took it
    outcome = attempt.outcome if attempt is not None else None
    landed = outcome == write
    if attempt is not None:
        JobEvent.objects.create(
            job_id=job_id,
            attempt=number,
            type=EventType.UNRESOLVED,
            worker=str(entry.get("worker", ""))[:200],
            data={
                "write": write,
                "gave_up_at": str(entry.get("gave_up_at"))[:50],
                "outcome_read": outcome,
                "landed": landed,
                "limit_seconds": jobs_settings().UNKNOWN_OUTCOME_SECONDS,
            },
        )
    logger.warning(
        "job %s attempt %s: its worker %s gave up resolving its final write (%s) at %s; read "
        "now from the database: attempt outcome %s -- the write %s",
        job_id,
        number,
        str(entry.get("worker"))[:200],
        write,
        str(entry.get("gave_up_at"))[:50],
        outcome or "(no such attempt)",
        "had landed" if landed else "did not land (the lease decided)",
    )
    taken.unlink(missing_ok=True)
    return True
