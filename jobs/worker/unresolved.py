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
Two schedulers on one host may both see a file: the rename to `.resolving-<pid>` takes it.
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


def resolve_pending(limit: int = 50) -> int:
    """Turn spooled entries of this database into `unresolved` events; return how many."""
    directory = spool_dir()
    try:
        paths = sorted(directory.glob("job-*.json"))[:limit]
    except OSError:
        return 0
    resolved = 0
    for path in paths:
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written, or taken by another scheduler
        if entry.get("database") != _database():
            continue
        if _resolve(path, entry):
            resolved += 1
    return resolved


def _resolve(path: Path, entry: dict[str, Any]) -> bool:
    job_id, number = int(entry["job_id"]), int(entry["attempt"])
    attempt = Attempt.objects.filter(job_id=job_id, number=number).first()
    if attempt is not None and attempt.outcome == AttemptOutcome.RUNNING:
        return False  # not decided yet: its lease or a late commit decides first
    taken = path.with_name(f"{path.name}.resolving-{os.getpid()}")
    try:
        os.rename(path, taken)
    except OSError:
        return False  # another scheduler took it
    outcome = attempt.outcome if attempt is not None else None
    landed = outcome == entry["write"]
    if attempt is not None:
        JobEvent.objects.create(
            job_id=job_id,
            attempt=number,
            type=EventType.UNRESOLVED,
            worker=str(entry.get("worker", ""))[:200],
            data={
                "write": entry["write"],
                "gave_up_at": entry.get("gave_up_at"),
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
        entry.get("worker"),
        entry["write"],
        entry.get("gave_up_at"),
        outcome or "(no such attempt)",
        "had landed" if landed else "did not land (the lease decided)",
    )
    taken.unlink(missing_ok=True)
    return True
