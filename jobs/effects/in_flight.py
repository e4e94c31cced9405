"""The effect steps one attempt has in flight: its calls of one step, one at a time.

Owns: `Steps`, held per claimed attempt (jobs.context.Held). The ledger (jobs/effects/keys.py)
cannot tell one attempt's call still running from one that ended without recording (its fn
raised): both leave the key's row `started` by this attempt, and a begin takes such a row over
and performs again. So a second call of a step while another thread of the same attempt is in
it would perform the effect twice at once. It waits here instead: once the first has recorded,
its begin finds the row done and returns the recorded result (`fn` not called); if the first
raised, it performs, as a retry inside the attempt does.

Hazards: a call nested in its own step's `fn` (the same thread) cannot wait for itself: it goes
on, as before (the inner call takes the row over and records; the outer returns its result).
A `fn` that waits for another thread calling its own step waits for itself: that thread waits
until the step ends, or the attempt's lease is lost.

Never: touches the database; waits past the attempt's lost lease.
"""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

LOOK_SECONDS = 0.5  # how often a waiting call looks whether its attempt's lease was lost


class _Lost(Protocol):
    """The attempt's lost flag (jobs.context.Flag)."""

    def is_set(self) -> bool: ...


class Steps:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._owner: dict[str, int] = {}  # step -> the thread in it
        self._waiting: dict[str, int] = {}  # step -> calls waiting for it (tests read it)

    def waiting(self, step: str) -> int:
        with self._changed:
            return self._waiting.get(step, 0)

    @contextmanager
    def one(self, step: str, lost: "_Lost", raise_lost: Callable[[], None]) -> Iterator[None]:
        """Be the only thread of this attempt in `step` (a nested call of the same thread goes
        on); `raise_lost()` if the attempt's lease is lost while waiting."""
        me = threading.get_ident()
        with self._changed:
            if self._owner.get(step) == me:
                nested = True
            else:
                nested = False
                self._waiting[step] = self._waiting.get(step, 0) + 1
                try:
                    while step in self._owner:
                        if lost.is_set():
                            raise_lost()
                        self._changed.wait(LOOK_SECONDS)
                finally:
                    self._waiting[step] -= 1
                    if not self._waiting[step]:
                        del self._waiting[step]
                self._owner[step] = me
        try:
            yield
        finally:
            if not nested:
                with self._changed:
                    del self._owner[step]
                    self._changed.notify_all()
