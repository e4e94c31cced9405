"""What a running attempt has produced that only its commit makes real: staged outputs, intents.

Owns: the in-memory record of one attempt's work -- whether it staged outputs (so the commit
points `Job.result_ref` at them) and which outbox intents it recorded (so the commit inserts them
in its own statement). The record lives on what the drain holds for the attempt
(jobs.context.Held.work), made at its first record: an attempt that records nothing -- most of
them -- costs nothing here. The completer reads it with `peek` when it commits and ends it with
`forget` once the attempt's final write is decided. Never: writes anything.

Hazards: the handler adds in the runner's thread while the background heartbeat thread may commit
the same attempt, hence the lock. A thread the handler left running may record after the attempt
ended: `peek` marks the work read and `forget` ends it -- an attempt that had recorded nothing is
marked all the same (its Held then carries the shared READ/ENDED marks, never written) -- and a
record after either raises AttemptEnded (a LeaseLost) instead of making an entry that nothing
would ever commit (and, between the two, that forget would drop without a word). Nothing is kept
anywhere else: an attempt that never reaches a final write here (handed back unstarted, a stop)
leaves nothing behind once its Held is gone. A process that dies loses it with everything else.
Until 2026-12-07 every claimed attempt opened its record in a process-wide weak registry at
claim time (~15 % of the drain's client instructions a no-op job; docs/benchmarks.md).
"""

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

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
    staged: bool = False
    intents: dict[str, IntentRow] = field(default_factory=dict)  # by step: last one recorded
    chars: int = 0  # of the intents' JSON text
    ended: bool = False  # forgotten: its final write is decided, nothing more is recorded
    read: bool = False  # its commit read it (peek): what is recorded now would not be committed


# The marks of an attempt that had recorded nothing when its commit read it (READ) or its final
# write was decided (ENDED). Shared, so never written: every record refuses them first.
READ = AttemptWork(read=True)
ENDED = AttemptWork(ended=True)


class Holder(Protocol):
    """What the drain holds for an attempt (jobs.context.Held): its fence and its work."""

    fence: Fence
    work: AttemptWork | None


_lock = threading.Lock()


def _refuse_if_ended(held: Holder, what: str) -> AttemptWork:
    """Under _lock: the attempt's work, made now if it recorded nothing yet; AttemptEnded once
    its commit read it or its final write was decided."""
    work = held.work
    if work is None:
        work = held.work = AttemptWork()
    elif work.ended or work.read:
        exc = AttemptEnded(held.fence.job_id, held.fence.attempt, what)
        logger.warning("%s (a thread the handler left running?)", exc)
        raise exc
    return work


def check_open(held: Holder, what: str) -> None:
    """AttemptEnded if the attempt's final write is decided (before work that would be lost)."""
    with _lock:
        work = held.work
        if work is not None and (work.ended or work.read):
            _refuse_if_ended(held, what)


def staged(held: Holder) -> bool:
    """Whether the attempt has staged an output (its commit names its prefix)."""
    work = held.work
    return work is not None and work.staged


def mark_staged(held: Holder) -> None:
    with _lock:
        _refuse_if_ended(held, "stage").staged = True


def add_intent(held: Holder, intent: IntentRow) -> None:
    """Record `intent` (its data is the checked JSON text); InvalidOption past the attempt's
    bounds, AttemptEnded once its final write is decided: nothing recorded then."""
    with _lock:
        work = _refuse_if_ended(held, "intent")
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


def peek(held: Holder) -> Recorded | None:
    """The attempt's work if it recorded any and has not ended, as its commit reads it (after
    the handler returned): from now on a record is refused -- made between this read and the
    commit's forget(), it was in no commit and dropped without a word."""
    return peek_many((held,)).get(held.fence.job_id)


def peek_many(helds: Iterable[Holder]) -> dict[int, Recorded]:
    """peek() for a batch's attempts under one lock: job id -> what it recorded, for those that
    recorded anything and have not ended (most record nothing)."""
    found: dict[int, Recorded] = {}
    with _lock:
        for held in helds:
            work = held.work
            if work is None:
                held.work = READ
            elif not (work.ended or work is READ):
                work.read = True
                if work.staged or work.intents:
                    found[held.fence.job_id] = Recorded(work.staged, dict(work.intents), work.chars)
    return found


def forget(held: Holder) -> None:
    """The attempt's final write is decided: its work ends, and a later record is refused."""
    forget_many((held,))


def forget_many(helds: Iterable[Holder]) -> None:
    """forget() for a batch's attempts under one lock."""
    with _lock:
        for held in helds:
            work = held.work
            if work is None or work is READ:
                held.work = ENDED
            elif work is not ENDED:  # kept (its `staged` still says what the commit named)
                work.ended = True
                work.intents, work.chars = {}, 0  # the leaked thread's ctx keeps the Held
