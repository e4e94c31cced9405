"""What a running attempt has produced that only its commit makes real: staged outputs, intents.

Owns: the in-memory record of one attempt's work -- whether it staged outputs (so the commit
points `Job.result_ref` at them) and which outbox intents it recorded (so the commit inserts them
in its own statement). Each held attempt carries its own `AttemptWork` (jobs.context.Held.work,
opened when the drain takes the claim); the completer finds it by (job id, attempt) through a
weak registry, and `forget` ends it once the attempt's final write is decided. Never: writes
anything; jobs.worker.completer reads it when it commits and forgets it after.

Hazards: the handler adds in the runner's thread while the background heartbeat thread may commit
the same attempt, hence the lock. A thread the handler left running may record after the attempt
ended: the work is marked read by the commit's `peek` and ended by `forget`, and a record after
either raises AttemptEnded (a LeaseLost) instead of making an entry that nothing would ever commit
(and, between the two, that forget would drop without a word). The registry holds the
work weakly: an attempt that never reaches a final write here (handed back unstarted, a stop)
leaves nothing behind once its Held is gone. A process that dies loses it with everything else.
"""

import logging
import threading
import weakref
from dataclasses import dataclass, field

from jobs.core.exceptions import AttemptEnded, InvalidOption
from jobs.core.sql import IntentRow
from jobs.core.transitions import Fence

logger = logging.getLogger("jobs.fencing")

# What one attempt's intents may add to its commit (each intent is bounded on its own too): every
# intent rides in the batch commit beside its batch-mates' rows, so an unbounded number would
# stall the commit, and the heartbeats of every job the worker holds, for this one job.
MAX_INTENTS = 1000  # distinct steps an attempt records
MAX_INTENTS_CHARS = 1 << 20  # characters of JSON text in all of them


@dataclass(eq=False)
class AttemptWork:
    fence: Fence
    staged: bool = False
    intents: dict[str, IntentRow] = field(default_factory=dict)  # by step: last one recorded
    chars: int = 0  # of the intents' JSON text
    ended: bool = False  # forgotten: its final write is decided, nothing more is recorded
    read: bool = False  # its commit read it (peek): what is recorded now would not be committed


_lock = threading.Lock()
_open: "weakref.WeakValueDictionary[tuple[int, int], AttemptWork]" = weakref.WeakValueDictionary()


def _key(fence: Fence) -> tuple[int, int]:
    return fence.job_id, fence.attempt


def open_work(fence: Fence) -> AttemptWork:
    """A new, empty record of the attempt `fence` names (its Held keeps it alive), found by the
    completer until `forget`. A claim is held once; opened again, the newest record is the one
    the commit reads."""
    work = AttemptWork(fence)
    with _lock:
        _open[_key(fence)] = work
    return work


def _refuse_if_ended(work: AttemptWork, what: str) -> None:
    """Under _lock."""
    if work.ended or work.read:
        exc = AttemptEnded(work.fence.job_id, work.fence.attempt, what)
        logger.warning("%s (a thread the handler left running?)", exc)
        raise exc


def check_open(work: AttemptWork, what: str) -> None:
    """AttemptEnded if the attempt's final write is decided (before work that would be lost)."""
    with _lock:
        _refuse_if_ended(work, what)


def mark_staged(work: AttemptWork) -> None:
    with _lock:
        _refuse_if_ended(work, "stage")
        work.staged = True


def add_intent(work: AttemptWork, intent: IntentRow) -> None:
    """Record `intent` (its data is the checked JSON text); InvalidOption past the attempt's
    bounds, AttemptEnded once its final write is decided: nothing recorded then."""
    with _lock:
        _refuse_if_ended(work, "intent")
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


@dataclass(frozen=True)
class Recorded:
    """What an attempt recorded, as the commit reads it."""

    staged: bool
    intents: dict[str, IntentRow]
    chars: int


def peek(fence: Fence) -> Recorded | None:
    """The attempt's work if it recorded any and has not ended, as its commit reads it (after
    the handler returned): from now on a record is refused -- made between this read and the
    commit's forget(), it was in no commit and dropped without a word."""
    with _lock:
        work = _open.get(_key(fence))
        if work is None or work.ended:
            return None
        work.read = True
        if not (work.staged or work.intents):
            return None
        return Recorded(work.staged, dict(work.intents), work.chars)


def forget(fence: Fence) -> None:
    """The attempt's final write is decided: its work ends, and a later record is refused."""
    with _lock:
        work = _open.pop(_key(fence), None)
        if work is not None:
            work.ended = True
            work.intents, work.chars = {}, 0  # a leaked thread's ctx keeps the Held, not these
