"""The background heartbeat: one thread per drain that keeps the held leases alive.

Owns: periodic fenced lease extension for every job a drain holds (claimed, not yet finished).
Never: decides a job's outcome. A heartbeat that changes zero rows is recorded by
transitions.heartbeat_many and flips the job's `lost` flag; the handler finds out cooperatively at
its next ctx.heartbeat()/ctx.checkpoint(), and the runner skips the commit.

Hazards: the thread has its own database connection (Django connections are per thread) and
closes it on exit. A database error in a beat is logged and retried at the next tick; the commit's
compare-and-set remains the last word, so a missed beat can cost a lease, never correctness.
"""

import logging
import threading
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, connection

from jobs import transitions
from jobs.transitions import Fence

logger = logging.getLogger("jobs.heartbeat")


@dataclass
class Held:
    fence: Fence
    lease_seconds: float
    lost: threading.Event = field(default_factory=threading.Event)


class Heartbeater:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop, or a shorter lease arrived: re-plan the next beat
        self._thread = threading.Thread(target=self._run, name="jobs-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeater":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def hold(self, fence: Fence, lease_seconds: float) -> Held:
        held = Held(fence, lease_seconds)
        with self._lock:
            self._held[fence.job_id] = held
            # A shorter lease than the one held here means beating more often -- starting now,
            # not after the longer wait the thread is already in.
            if lease_seconds / 3.0 < self.interval:
                self.interval = lease_seconds / 3.0
                self._wake.set()
        return held

    def release(self, fence: Fence) -> None:
        with self._lock:
            self._held.pop(fence.job_id, None)

    def beat_now(self) -> None:
        with self._lock:
            batch = list(self._held.values())
        if not batch:
            return
        lost = transitions.heartbeat_many([(h.fence, h.lease_seconds) for h in batch])
        confirmed = []
        with self._lock:
            for h in batch:
                # A job released meanwhile is being committed: its own fenced write decides,
                # and a zero-row beat racing that commit is no evidence of a lost lease.
                if h.fence.job_id in lost and self._held.get(h.fence.job_id) is h:
                    h.lost.set()
                    del self._held[h.fence.job_id]
                    confirmed.append(h.fence)
        for fence in confirmed:
            transitions.record_lost_heartbeat(fence)

    def _run(self) -> None:
        last = time.monotonic()
        try:
            while True:
                self._wake.wait(max(0.0, last + self.interval - time.monotonic()))
                self._wake.clear()
                if self._stop.is_set():
                    return
                if time.monotonic() < last + self.interval:
                    continue  # woken to re-plan with a shorter interval
                last = time.monotonic()
                try:
                    self.beat_now()
                except DatabaseError:
                    logger.exception("heartbeat failed; retrying next tick")
                    connection.close()
        finally:
            connection.close()
