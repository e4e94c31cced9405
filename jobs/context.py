"""The handler's view of its attempt: identity, payload and fenced writes.

Owns: what a handler may do while it runs. Never: commits -- the runner does, once, after the
handler returns. stage/effect/intent/fenced_write arrive with the effects work.

Hazards: a handler may call ctx.heartbeat()/ctx.checkpoint() inside its own
`transaction.atomic()`. A fenced write must never join that transaction (the job row's lock would
last as long as the handler's transaction, blocking the drain's heartbeat and the reaper, and a
rollback would erase the RejectedWrite record), so such a call runs on a connection of its own,
in a side thread: Django's connections are per thread.
"""

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connection

from jobs import bounds, transitions
from jobs.conf import jobs_settings
from jobs.connectivity import bounded
from jobs.exceptions import LeaseLost
from jobs.heartbeat import Held
from jobs.states import Write

# One thread per worker process, started on first use: its database connection is the fenced
# writes' own and stays open for the rest of the drain (a connection per call would cost a
# connect each); the runner closes it when the drain ends.
_side_writer = ThreadPoolExecutor(1, thread_name_prefix="jobs-fenced-write")
_side_used = threading.Event()


def close_side_connection() -> None:
    if _side_used.is_set():
        _side_used.clear()
        # Resolved inside the side thread: Django's `connection` is per thread.
        _side_writer.submit(lambda: connection.close()).result()


def _outside_callers_transaction(write: Callable[[], None]) -> None:
    # Bounded (jobs.connectivity): a partition fails the write instead of hanging the handler.
    if not connection.in_atomic_block:
        with bounded("a handler's fenced write"):
            write()
        return

    def on_own_connection() -> None:
        connection.close_if_unusable_or_obsolete()
        with bounded("a handler's fenced write"):
            write()

    _side_used.set()
    _side_writer.submit(on_own_connection).result()


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

    def _fenced(self, write: str, action: Callable[[], None]) -> None:
        self._raise_if_lost(write)
        try:
            _outside_callers_transaction(action)
        except LeaseLost:
            self._held.lost.set()
            raise

    def heartbeat(self) -> None:
        """Extend the lease now; raises LeaseLost if this attempt no longer owns the job."""
        fence, lease = self._held.fence, self._held.lease_seconds
        self._fenced(Write.HEARTBEAT, lambda: transitions.heartbeat(fence, lease))

    def checkpoint(self, progress: Any) -> None:
        """Record JSON progress (and extend the lease); raises LeaseLost like heartbeat().

        Progress is bounded like a payload: jobs.InvalidPayload (a ValueError) for what is not
        plain JSON the database can store or is larger than JOBS['MAX_PAYLOAD_BYTES'].
        """
        bounds.json_value(progress, jobs_settings().MAX_PAYLOAD_BYTES, what="progress")
        fence, lease = self._held.fence, self._held.lease_seconds
        self._fenced(Write.CHECKPOINT, lambda: transitions.checkpoint(fence, progress, lease))

    def __repr__(self) -> str:
        return f"<JobContext {self.kind}#{self.job_id} attempt {self.attempt}>"
