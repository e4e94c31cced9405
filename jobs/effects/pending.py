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

from jobs.core.exceptions import InvalidOption
from jobs.core.sql import IntentRow
from jobs.core.transitions import Fence

# What one attempt's intents may add to its commit (each intent is bounded on its own too): every
# intent rides in the batch commit beside its batch-mates' rows, so an unbounded number would
# stall the commit, and the heartbeats of every job the worker holds, for this one job.
MAX_INTENTS = 1000  # distinct steps an attempt records
MAX_INTENTS_CHARS = 1 << 20  # characters of JSON text in all of them


@dataclass
class AttemptWork:
    staged: bool = False
    intents: dict[str, IntentRow] = field(default_factory=dict)  # by step: last one recorded
    chars: int = 0  # of the intents' JSON text


_lock = threading.Lock()
_work: dict[tuple[int, int], AttemptWork] = {}


def _key(fence: Fence) -> tuple[int, int]:
    return fence.job_id, fence.attempt


def mark_staged(fence: Fence) -> None:
    with _lock:
        _work.setdefault(_key(fence), AttemptWork()).staged = True


def add_intent(fence: Fence, intent: IntentRow) -> None:
    """Record `intent` (its data is the checked JSON text); InvalidOption past the attempt's
    bounds, nothing recorded then."""
    with _lock:
        work = _work.setdefault(_key(fence), AttemptWork())
        replaced = work.intents.get(intent.step)
        count = len(work.intents) + (replaced is None)
        chars = work.chars - (len(replaced.data) if replaced else 0) + len(intent.data)
        if count > MAX_INTENTS:
            raise InvalidOption(f"intent(): an attempt records at most {MAX_INTENTS} intents")
        if chars > MAX_INTENTS_CHARS:
            raise InvalidOption(
                f"intent(): an attempt's intents hold at most {MAX_INTENTS_CHARS} characters "
                f"of JSON in all ({chars} with this one)"
            )
        work.intents[intent.step] = intent
        work.chars = chars


def peek(fence: Fence) -> AttemptWork | None:
    with _lock:
        work = _work.get(_key(fence))
        return None if work is None else AttemptWork(work.staged, dict(work.intents), work.chars)


def forget(fence: Fence) -> None:
    with _lock:
        _work.pop(_key(fence), None)
