"""The handler a drain runs now, and its execution timeout: who ends an attempt that overran.

Owns: which held job's handler is running and since when (the drain's background thread
confirms it at its next beat, and hands off the batch-mates waiting behind it for long), its
deadline, and the one decision -- taken under the drain's lock -- whether a handler that reaches
its deadline timed out (the background thread then fails its attempt: jobs.worker.watchdog) or
returned (the runner ends its attempt). Never both: a handler returning right at its timeout
was once handed over by the runner and committed, then "failed" by the thread, whose rejected
fail deleted the committed attempt's outputs.

Never: writes anything or ends an attempt itself; takes no lock of its own -- `Heartbeater`
calls `start`, `returned`, `take` and `timed_out` under its lock.

Hazards: `start` is plain assignments, the handler named before its deadline, so a due
deadline always finds its handler; the
deadline and its callback are one tuple, so the thread never pairs one handler's deadline with
another's callback.
"""

import time
from collections.abc import Callable

from jobs.context import Held

Deadline = tuple[float, Callable[[], None]]  # time.monotonic() it overruns at, on_timeout


class Running:
    def __init__(self) -> None:
        self.held: Held | None = None
        self.since = 0.0  # time.monotonic() when it started
        self._deadline: Deadline | None = None
        self._fired: Deadline | None = None  # the deadline the thread acted on (never twice)
        self._timed_out: set[int] = set()  # job ids taken by a timeout

    def start(
        self, held: Held | None, timeout: float | None, on_timeout: Callable[[], None] | None
    ) -> float:
        """(Under the lock.) Returns when it started (time.monotonic())."""
        self.since = since = time.monotonic()
        self.held = held
        if held is not None and timeout is not None and on_timeout is not None:
            self._deadline = (self.since + timeout, on_timeout)
        else:
            self._deadline = None
        return since

    def returned(self, held: Held) -> bool:
        """(Under the lock.) The handler of `held` returned, or raised: True if its attempt is
        still the runner's to end, False if its timeout took it first."""
        self.held = self._deadline = None
        return held.fence.job_id not in self._timed_out

    def take(self, held: Held) -> bool:
        """(Under the lock.) Its deadline passed: take the attempt for the thread to fail, or
        False if the handler returned first (the runner ends it; the timeout is void)."""
        if self.held is not held:
            return False
        self._timed_out.add(held.fence.job_id)
        return True

    def timed_out(self, held: Held) -> bool:
        """(Under the lock.)"""
        return held.fence.job_id in self._timed_out

    def deadline(self) -> float | None:
        deadline = self._deadline
        return deadline[0] if deadline else None

    def due(self, now: float) -> Callable[[], None] | None:
        """(The background thread only.) The running handler's `on_timeout`, once, when its
        deadline has passed; whether the handler is still running then, `take` decides."""
        deadline = self._deadline
        if deadline is None or deadline is self._fired or now < deadline[0]:
            return None
        self._fired = deadline
        return deadline[1]
