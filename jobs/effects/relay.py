"""The embedded relay: calls in flight per lane, so one dead receiver delays only its own intents.

Owns: how many outbox calls run at once -- at most PER_LANE per lane (a target, and the normalised
origin of the URL its data names, jobs/core/lanes.py: two webhook receivers are two lanes;
http://h, HTTP://h and http://user@h:80 are one) and THREADS in all, each on a daemon thread of its
own with its own database connection -- and claiming only what free slots allow
(jobs.effects.outbox.claim with `per_lane`). RESERVED of the THREADS are kept for lanes with no
slow call (jobs/effects/slots.py): one server reached as several lanes (ports, names, addresses)
that hangs takes the others, and a reserved one only for a lane not yet seen slow, until that
call's deadline. `pump()` claims and hands off; it never waits for a
call, so a lane that hangs holds its own slots while every other target's intents are claimed
and delivered. Every call, whatever its target, ends for the relay at CALL_DEADLINE: `pump()`
hands a call still out then back as an unknown outcome (inside its lease, under its token) and
frees its thread slot; the thread runs on, still counted in its lane (jobs/effects/slots.py).

Never: claims an intent it has no free slot for (its lease would run out while it waits); keeps
a claim across a crash -- the rows decide (jobs/effects/outbox.py).

Hazards: the call threads are daemons: a stopping process does not wait for calls in flight
(their claims' leases run out and the next relay reconciles them).
"""

import logging
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError, connection

from jobs.effects import outbox
from jobs.effects.slots import Slots

logger = logging.getLogger("jobs.outbox")

THREADS = 8  # calls in flight in all
PER_LANE = 2  # calls in flight for one lane (target + URL origin): a hanging one holds these
RESERVED = 2  # of THREADS, only for lanes with no slow call, one call of a lane at a time
SLOW_SECONDS = 2.0  # a call in flight this long makes its lane slow ...
SLOW_MEMORY = 600.0  # ... until this long after it was last seen slow
# How long any target's call may run, from its claim or its perform's lease renewal, before the
# relay gives up on it: the intent is handed back as an unknown outcome while the lease is still
# the relay's own (never taken over from a call in flight by lease expiry), and the call's thread
# slot is freed. Above the webhook's own total deadline (25 s at most), well below the lease.
CALL_DEADLINE = 30.0


@dataclass
class _InFlight:
    claim: outbox.Claim  # the claim the call runs under (its token)
    since: float  # monotonic: its claim, or its latest lease renewal


class Relay:
    def __init__(
        self,
        identity: str,
        threads: int = THREADS,
        per_lane: int = PER_LANE,
        lease_seconds: float = outbox.RELAY_LEASE_SECONDS,
        reserved: int = RESERVED,
        slow_seconds: float = SLOW_SECONDS,
        slow_memory: float = SLOW_MEMORY,
        call_deadline: float = CALL_DEADLINE,
    ) -> None:
        self.identity = identity
        self.threads = threads
        self.per_lane = per_lane
        self.lease_seconds = lease_seconds
        self.freed = threading.Event()  # set whenever a call ends: a slot may be free
        self.slots = Slots(threads, per_lane, reserved, slow_seconds, slow_memory)
        self.call_deadline = call_deadline
        self._lock = threading.Lock()
        self._calls: dict[int, _InFlight] = {}  # by slot handle, until given up on or ended

    def in_flight(self) -> dict[str, int]:
        """Calls in flight by lane, as the rows store it."""
        return self.slots.in_flight()

    def pump(self) -> int:
        """Claim as many due intents as free slots allow and start their calls; how many. The
        open threads first, then the reserved ones (jobs/effects/slots.py)."""
        self.freed.clear()  # before reading the slots: a call ending from now on sets it again
        self._give_up_overdue()
        started = 0
        for reserved in (False, True):
            plan = self.slots.plan(reserved)
            if plan.limit <= 0:
                continue
            claims = outbox.claim(
                self.identity,
                plan.limit,
                self.lease_seconds,
                per_lane=plan.per_lane,
                busy=plan.busy,
            )
            started += sum(self._start(c, reserved) for c in claims)
        return started

    def _start(self, c: outbox.Claim, reserved: bool) -> bool:
        """Start `c`'s call on a thread of its own. A thread that cannot start (RuntimeError
        "can't start new thread", MemoryError) is this intent's failure alone: its slot is
        released and it is handed back with backoff (nothing was sent), and the batch goes on."""
        handle = self.slots.start(c.lane, reserved)
        with self._lock:
            self._calls[handle] = _InFlight(c, time.monotonic())
        try:
            threading.Thread(
                target=self._handle, args=(c, handle), name=f"jobs-relay-{c.id}", daemon=True
            ).start()
            return True
        except Exception as exc:  # noqa: BLE001  this call's own failure; the others start
            self._ended(handle)
            why = f"its call's thread did not start: {type(exc).__name__}: {exc}"
            try:
                outbox.not_started(c, self.identity, why)
            except DatabaseError as db:  # the row keeps the truth: its lease runs out
                connection.close()
                logger.warning("relay: intent %s left to its lease (%s; %s)", c.key, why, db)
            return False

    def _renewed(self, handle: int, c: outbox.Claim) -> None:
        """`c`'s lease was renewed for its next call: its deadline starts again (unless the
        relay already gave up on the call)."""
        with self._lock:
            if handle in self._calls:
                self._calls[handle] = _InFlight(c, time.monotonic())

    def _ended(self, handle: int) -> None:
        with self._lock:
            self._calls.pop(handle, None)
        self.slots.end(handle)

    def _give_up_overdue(self) -> None:
        """Hand back every call out longer than the deadline (a target that hangs: the thread
        cannot be stopped, but its intent and its thread slot are freed; jobs/effects/slots.py
        still counts it in its lane). Each intent's own write: one failing stops no other."""
        now = time.monotonic()
        with self._lock:
            overdue = {h: f for h, f in self._calls.items() if now - f.since > self.call_deadline}
            for handle in overdue:
                del self._calls[handle]
        for handle, call in overdue.items():
            self.slots.abandon(handle)
            try:
                outbox.past_deadline(call.claim, self.identity, self.call_deadline)
            except DatabaseError as exc:  # the row keeps the truth: its lease runs out
                connection.close()
                logger.warning("relay: intent %s left to its lease (%s)", call.claim.key, exc)
            logger.warning(
                "relay: intent %s: no answer within %g s; its call is given up on (a hanging "
                "target holds a thread, not a slot)",
                call.claim.key,
                self.call_deadline,
            )

    def _handle(self, c: outbox.Claim, handle: int) -> None:
        def renewed(claim: outbox.Claim) -> None:
            self._renewed(handle, claim)

        try:
            try:
                outbox.handle(c, self.identity, self.lease_seconds, renewed)
            except DatabaseError:  # the connection died while the call was out: the row decides
                connection.close()  # ... read on a fresh one, while the claim is still ours
                again = outbox.reclaim(c, self.identity, self.lease_seconds)
                if again is not None:  # as the next relay would: unknown -> reconciled, but
                    # under a higher token, which fences out c's call if still in flight there
                    renewed(again)
                    outbox.handle(again, self.identity, self.lease_seconds, renewed)
        except DatabaseError as exc:  # the row keeps the truth: its lease runs out, reconciled
            logger.warning("relay: intent %s left to its lease (database error: %s)", c.key, exc)
        except Exception:  # noqa: BLE001  a bug in a target must not kill the relay
            logger.exception("relay: intent %s failed unexpectedly", c.key)
        finally:
            try:
                connection.close()  # this pool thread's own connection: never left open
            finally:  # the slot is freed whatever closing did
                self._ended(handle)
                self.freed.set()
