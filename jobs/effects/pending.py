"""What a running attempt has produced that only its commit makes real: staged outputs, intents.

Owns: the in-memory record, per (job id, attempt), of whether the attempt staged outputs (so the
commit points `Job.result_ref` at them) and which outbox intents it recorded (so the commit
inserts them in its own statement). Never: writes anything; jobs.worker.completer reads it when it
commits and forgets it once the attempt's final write is decided.

Hazards: the handler adds in the runner's thread while the background heartbeat thread may commit
the same attempt, hence the lock. An entry lives from the handler's first stage/intent until its
attempt's final write; a process that dies loses it with everything else it held in memory.
"""

import threading
from dataclasses import dataclass, field

from jobs.core.sql import IntentRow
from jobs.core.transitions import Fence


@dataclass
class AttemptWork:
    staged: bool = False
    intents: dict[str, IntentRow] = field(default_factory=dict)  # by step: last one recorded


_lock = threading.Lock()
_work: dict[tuple[int, int], AttemptWork] = {}


def _key(fence: Fence) -> tuple[int, int]:
    return fence.job_id, fence.attempt


def mark_staged(fence: Fence) -> None:
    with _lock:
        _work.setdefault(_key(fence), AttemptWork()).staged = True


def add_intent(fence: Fence, intent: IntentRow) -> None:
    with _lock:
        _work.setdefault(_key(fence), AttemptWork()).intents[intent.step] = intent


def peek(fence: Fence) -> AttemptWork | None:
    with _lock:
        work = _work.get(_key(fence))
        return None if work is None else AttemptWork(work.staged, dict(work.intents))


def forget(fence: Fence) -> None:
    with _lock:
        _work.pop(_key(fence), None)
