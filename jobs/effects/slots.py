"""The relay's call slots: how many calls each lane may start now, keeping some for lanes that
are not hanging.

Owns: the relay's (jobs/effects/relay.py) bookkeeping of calls in flight, and the plan for its
next claims (jobs.effects.outbox.claim), in two parts:
- the *open* threads (`threads - reserved`): any lane, at most `per_lane` calls in flight;
- the *reserved* threads: only a lane that is not slow, one call of it at a time there (and
  still at most `per_lane` in all).
A lane is *slow* while one of its calls has been in flight `slow_seconds` or more, and for
`slow_memory` seconds after the last such call was seen (up to MAX_SLOW lanes remembered, the
oldest forgotten first).

Why: a lane is a target and a URL's origin (jobs/core/lanes.py), and one server can be many
origins -- several ports, several names, several addresses. Lanes that hang then take the open
threads; of the reserved ones, a lane not yet seen slow takes at most one at a time, and once
that call has been out `slow_seconds` the lane is slow and takes only open threads (the call
keeps its reserved thread until it ends: the webhook's total deadline). So a healthy receiver's
intent waits for a thread at most until such calls end, once per hanging lane per
`slow_memory`, never for as long as they keep hanging.

Hazards: past MAX_SLOW lanes hanging at once the oldest is forgotten, and with more than
MAX_SLOW every hanging lane soon takes reserved threads again: the reserve holds up to MAX_SLOW.

Never: blocks, or touches the database (a plain in-memory ledger behind one lock; the clock is
injectable for tests).
"""

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

MAX_SLOW = 64  # lanes remembered slow: each is a range the reserved claim leaves out
MAX_ABANDONED = 64  # calls given up on, still running, that take no thread from the others


@dataclass(frozen=True)
class Plan:
    """One claim: at most `limit` intents, at most `per_lane` per lane counting `busy`."""

    limit: int
    per_lane: int
    busy: dict[str, int] = field(default_factory=dict)


@dataclass
class _Call:
    lane: str
    reserved: bool
    started: float
    abandoned: bool = False  # past the relay's deadline: its thread runs on, its slot is freed


class Slots:
    def __init__(
        self,
        threads: int,
        per_lane: int,
        reserved: int,
        slow_seconds: float,
        slow_memory: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threads = threads
        self.per_lane = per_lane
        self.reserved = max(0, min(reserved, threads - 1))  # at least one open thread
        self.slow_seconds = slow_seconds
        self.slow_memory = slow_memory
        self.clock = clock
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._ids = count(1)
        self._slow: dict[str, float] = {}  # lane -> when it was last seen slow

    def in_flight(self) -> dict[str, int]:
        with self._lock:
            return dict(Counter(c.lane for c in self._calls.values()))

    def slow(self) -> set[str]:
        with self._lock:
            return set(self._slow_now())

    def start(self, lane: str, reserved: bool = False) -> int:
        """A call of `lane` begins (in a reserved thread or not); its handle for end()."""
        with self._lock:
            handle = next(self._ids)
            self._calls[handle] = _Call(lane, reserved, self.clock())
            return handle

    def abandon(self, handle: int) -> None:
        """The call's deadline passed (jobs/effects/relay.py): its thread cannot be stopped and
        runs on, but its thread slot is freed for the others. It still counts in its lane (a
        hanging lane never has more than `per_lane` calls out, given up on or not), and, past
        MAX_ABANDONED such calls, in the threads too: a relay never piles up threads unbounded."""
        with self._lock:
            call = self._calls.get(handle)
            if call is not None:
                call.abandoned = True
                self._mark(call.lane, self.clock())

    def end(self, handle: int) -> None:
        with self._lock:
            call = self._calls.pop(handle, None)
            if call is not None and self.clock() - call.started >= self.slow_seconds:
                self._mark(call.lane, self.clock())

    def plan(self, reserved: bool) -> Plan:
        """The next claim for the open threads, or for the reserved ones. Plan the open ones
        first and start() their calls before planning the reserved ones: it counts them."""
        with self._lock:
            slow = self._slow_now()
            calls = self._calls.values()
            busy = Counter(c.lane for c in calls)
            in_reserve = Counter(c.lane for c in calls if c.reserved and not c.abandoned)
            if not reserved:
                abandoned = sum(c.abandoned for c in calls)
                open_busy = sum(not c.reserved and not c.abandoned for c in calls)
                open_busy += max(0, abandoned - MAX_ABANDONED)
                return Plan(self.threads - self.reserved - open_busy, self.per_lane, dict(busy))
            shut = {lane for lane in busy if in_reserve[lane] or busy[lane] >= self.per_lane}
            return Plan(
                self.reserved - sum(in_reserve.values()),
                1,  # one call of a lane at a time in the reserved threads
                dict.fromkeys(sorted(shut | slow), 1),
            )

    def _mark(self, lane: str, now: float) -> None:
        self._slow.pop(lane, None)
        self._slow[lane] = now  # the newest last: the oldest is forgotten first
        while len(self._slow) > MAX_SLOW:
            del self._slow[next(iter(self._slow))]

    def _slow_now(self) -> set[str]:
        now = self.clock()
        for call in self._calls.values():
            if now - call.started >= self.slow_seconds:
                self._mark(call.lane, now)
        for lane in [lane for lane, seen in self._slow.items() if now - seen > self.slow_memory]:
            del self._slow[lane]
        return set(self._slow)
