"""The embedded relay: calls in flight per lane, so one dead receiver delays only its own intents.

Owns: how many outbox calls run at once -- at most PER_LANE per lane (a target, and the normalised
origin of the URL its data names, jobs/core/lanes.py: two webhook receivers are two lanes;
http://h, HTTP://h and http://user@h:80 are one) and THREADS in all, each on a daemon thread of its
own with its own database connection -- and claiming only what free slots allow
(jobs.effects.outbox.claim with `per_lane`). RESERVED of the THREADS are kept for lanes with no
slow call (jobs/effects/slots.py): one server reached as several lanes (ports, names, addresses)
that hangs takes the others, and a reserved one only for a lane not yet seen slow, until that
call's deadline. `pump()` claims and hands off; it never waits for a
call, so a lane that hangs holds its own slots until its call's total deadline
(jobs/effects/webhook.py), while every other target's intents are claimed and delivered.

Never: claims an intent it has no free slot for (its lease would run out while it waits); keeps
a claim across a crash -- the rows decide (jobs/effects/outbox.py).

Hazards: the call threads are daemons: a stopping process does not wait for calls in flight
(their claims' leases run out and the next relay reconciles them).
"""

import logging
import threading

from django.db import DatabaseError, connection

from jobs.effects import outbox
from jobs.effects.slots import Slots

logger = logging.getLogger("jobs.outbox")

THREADS = 8  # calls in flight in all
PER_LANE = 2  # calls in flight for one lane (target + URL origin): a hanging one holds these
RESERVED = 2  # of THREADS, only for lanes with no slow call, one call of a lane at a time
SLOW_SECONDS = 2.0  # a call in flight this long makes its lane slow ...
SLOW_MEMORY = 600.0  # ... until this long after it was last seen slow


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
    ) -> None:
        self.identity = identity
        self.threads = threads
        self.per_lane = per_lane
        self.lease_seconds = lease_seconds
        self.freed = threading.Event()  # set whenever a call ends: a slot may be free
        self.slots = Slots(threads, per_lane, reserved, slow_seconds, slow_memory)

    def in_flight(self) -> dict[str, int]:
        """Calls in flight by lane, as the rows store it."""
        return self.slots.in_flight()

    def pump(self) -> int:
        """Claim as many due intents as free slots allow and start their calls; how many. The
        open threads first, then the reserved ones (jobs/effects/slots.py)."""
        self.freed.clear()  # before reading the slots: a call ending from now on sets it again
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
        try:
            threading.Thread(
                target=self._handle, args=(c, handle), name=f"jobs-relay-{c.id}", daemon=True
            ).start()
            return True
        except Exception as exc:  # noqa: BLE001  this call's own failure; the others start
            self.slots.end(handle)
            why = f"its call's thread did not start: {type(exc).__name__}: {exc}"
            try:
                outbox.not_started(c, self.identity, why)
            except DatabaseError as db:  # the row keeps the truth: its lease runs out
                connection.close()
                logger.warning("relay: intent %s left to its lease (%s; %s)", c.key, why, db)
            return False

    def _handle(self, c: outbox.Claim, handle: int) -> None:
        try:
            try:
                outbox.handle(c, self.identity, self.lease_seconds)
            except DatabaseError:  # the connection died while the call was out: the row decides
                connection.close()  # ... read on a fresh one, while the claim is still ours
                again = outbox.reclaim(c, self.identity, self.lease_seconds)
                if again is not None:  # as the next relay would: unknown -> reconciled, but
                    # under a higher token, which fences out c's call if still in flight there
                    outbox.handle(again, self.identity, self.lease_seconds)
        except DatabaseError as exc:  # the row keeps the truth: its lease runs out, reconciled
            logger.warning("relay: intent %s left to its lease (database error: %s)", c.key, exc)
        except Exception:  # noqa: BLE001  a bug in a target must not kill the relay
            logger.exception("relay: intent %s failed unexpectedly", c.key)
        finally:
            try:
                connection.close()  # this pool thread's own connection: never left open
            finally:  # the slot is freed whatever closing did
                self.slots.end(handle)
                self.freed.set()
