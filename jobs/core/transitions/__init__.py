"""The only writer of a job's state, attempt, lease and result.

Every transition is one conditional statement decided inside the database against (id, attempt,
state), with its Attempt and event rows in the same transaction; a write that changes zero rows
is a lost lease, recorded and raised as LeaseLost. Split by who writes:

- fence.py       -- `Fence`, the transaction a fenced statement runs in, recording rejections;
- worker.py      -- a worker's: claim, heartbeat, checkpoint, commit, fail, release, poison;
- maintenance.py -- the reaper's: find expired leases (or an exited worker's), reclaim them;
- operator.py    -- an operator's: requeue, cancel, retry now.

Callers use this package's names (`transitions.claim(...)`), never a submodule's private ones.
"""

from jobs.core.exceptions import LeaseLost
from jobs.core.transitions.fence import (
    Claimed,
    Fence,
    attempt_outcome,
    joining_callers_transaction,
    record_rejected,
    rejection_landed,
)
from jobs.core.transitions.maintenance import find_expired, find_held_by, reclaim_expired
from jobs.core.transitions.operator import OperatorResult, cancel, requeue, retry_now
from jobs.core.transitions.worker import (
    checkpoint,
    claim,
    commit,
    commit_many,
    confirm_running,
    count_due,
    fail,
    heartbeat,
    heartbeat_many,
    mark_lost,
    poison,
    record_lost_heartbeat,
    refresh_limits,
    release,
)

__all__ = [
    "Claimed",
    "Fence",
    "LeaseLost",
    "OperatorResult",
    "attempt_outcome",
    "cancel",
    "checkpoint",
    "claim",
    "commit",
    "commit_many",
    "confirm_running",
    "count_due",
    "fail",
    "find_expired",
    "find_held_by",
    "heartbeat",
    "heartbeat_many",
    "joining_callers_transaction",
    "mark_lost",
    "poison",
    "reclaim_expired",
    "record_lost_heartbeat",
    "rejection_landed",
    "refresh_limits",
    "record_rejected",
    "release",
    "requeue",
    "retry_now",
]
