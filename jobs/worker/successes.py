"""A drain's finished successes on their way to the commit, and which thread commits them.

Owns: the successes a drain's handlers returned and that are not committed yet; when the oldest
must be committed (FLUSH_SECONDS after its handler returned); the runner's request, at the end of
a batch, that the drain's background thread commit them at once (`hand_over`), so the commit's
round trip and WAL flush overlap the next claim's instead of following it; and waiting for the
commits on their way. Never: decides an outcome or writes itself -- the caller runs the commit
(jobs.worker.completer) on its own thread's connection, each row fenced by its own attempt.

Hazards: a success handed over is committed later than its batch's end, never lost to a batch
that follows: at most one commit is on its way in the background thread and one batch's
successes wait behind it (a batch that ends while one is on its way is handed over all the
same: the thread commits it next, and the runner goes on claiming instead of committing it
itself; the end of a batch after that, with both places taken, commits the waiting one and its
own on the runner's thread -- without waiting for the one on its way, which at a drain's start
is also the thread opening its connection: until 2026-12-07 the runner's next claim waited
~11 ms for it); and `commit(wait=True)` --
every thread's but the background one's -- waits for it, so "flushed" still means "committed"
to whoever asks (the drain's end, a confirmed job, a stop). A worker that dies before the commit
leaves the job to its lease, as before: up to three batches' successes then run again (the
one on its way, the one waiting, the one running), where it was two until 2026-12-05.
"""

import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jobs.context import Held
from jobs.core.transitions import Claimed

# A finished success is committed by the thread once it has waited this long (if the runner has
# not committed it with its batch first); the thread looks that often, so the wait is < 2x this.
FLUSH_SECONDS = 0.2


class Finished(NamedTuple):  # one per job: a named tuple is built in a third of the time
    held: Held
    claimed: Claimed
    result: Any
    at: float  # time.monotonic() when the handler returned


Commit = Callable[[Sequence[Finished]], None]


class Successes:
    """The finished successes of one drain (`lock` is the drain's Heartbeater lock)."""

    def __init__(self, lock: threading.Lock, commit: Commit) -> None:
        self._lock = lock
        self._commit = commit
        self._items: list[Finished] = []
        self.handed_over = False  # the background thread is to commit them now
        self._committing = 0  # commits on their way, in any thread
        self._settled = threading.Condition(lock)

    def add(self, item: Finished) -> None:
        with self._lock:
            self._items.append(item)

    def add_locked(self, item: Finished) -> None:
        """`add`, for a caller that holds the lock."""
        self._items.append(item)

    def due_at(self) -> float | None:
        """When the oldest success must be committed at the latest (time.monotonic())."""
        with self._lock:
            return self._items[0].at + FLUSH_SECONDS if self._items else None

    def due(self, now: float) -> bool:
        if self.handed_over:
            return True
        at = self.due_at()
        return at is not None and at <= now

    def hand_over(self) -> bool:
        """Ask the background thread to commit what is here now, or as soon as the commit it has
        on its way ends; False if the runner must commit it itself (a hand-over already waits
        for the thread), True if there is nothing to commit or the thread is to commit it
        (`handed_over` then tells the caller to wake the thread).

        Until 2026-12-05 a commit on its way also made the runner commit itself, and wait for
        that commit too: where the database has a core to spare (one worker process on this
        2-core machine: `bench/run.py --workers 1`), the drain ran at 8,785 jobs/s against
        11,463 with the hand-over waiting behind it instead."""
        with self._lock:
            if not self._items:
                return True  # a batch without successes: nothing to hand over, nobody to wake
            if self.handed_over:
                return False
            self.handed_over = True
            return True

    def commit(self, release: Callable[[list[Finished]], object], wait: bool) -> None:
        """Commit every success here now, `release` them from the held jobs first (under the
        lock); with `wait`, return only once the commits on their way in other threads ended."""
        with self._lock:
            items, self._items = self._items, []
            self.handed_over = False
            if items:
                release(items)
            if items:
                self._committing += 1
        try:
            if items:
                self._commit(items)
        finally:
            with self._lock:
                if items:
                    self._committing -= 1
                    self._settled.notify_all()
                while wait and self._committing:
                    # A commit on its way is bounded (jobs.core.connectivity) and always ends.
                    self._settled.wait(1.0)
