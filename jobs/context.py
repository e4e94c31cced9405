"""The handler's view of its attempt: identity, payload and fenced writes.

Owns: what a handler may do while it runs. Never: commits -- the runner does, once, after the
handler returns. stage/effect/intent/fenced_write arrive with the effects work.
"""

from typing import Any

from jobs import transitions
from jobs.exceptions import LeaseLost
from jobs.heartbeat import Held
from jobs.states import Write


class JobContext:
    def __init__(self, held: Held, kind: str, payload: Any) -> None:
        self._held = held
        self.kind = kind
        self.payload = payload

    @property
    def job_id(self) -> int:
        return self._held.fence.job_id

    @property
    def attempt(self) -> int:
        return self._held.fence.attempt

    @property
    def worker(self) -> str:
        return self._held.fence.worker

    def _raise_if_lost(self, write: str) -> None:
        if self._held.lost.is_set():
            raise LeaseLost(self.job_id, self.attempt, write)

    def heartbeat(self) -> None:
        """Extend the lease now; raises LeaseLost if this attempt no longer owns the job."""
        self._raise_if_lost(Write.HEARTBEAT)
        try:
            transitions.heartbeat(self._held.fence, self._held.lease_seconds)
        except LeaseLost:
            self._held.lost.set()
            raise

    def checkpoint(self, progress: Any) -> None:
        """Record JSON progress (and extend the lease); raises LeaseLost like heartbeat()."""
        self._raise_if_lost(Write.CHECKPOINT)
        try:
            transitions.checkpoint(self._held.fence, progress, self._held.lease_seconds)
        except LeaseLost:
            self._held.lost.set()
            raise

    def __repr__(self) -> str:
        return f"<JobContext {self.kind}#{self.job_id} attempt {self.attempt}>"
