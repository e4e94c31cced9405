"""The embedded relay: calls in flight per target, so one dead target delays only its own intents.

Owns: how many outbox calls run at once -- at most PER_LANE per lane (a target, and the normalised
origin of the URL its data names, jobs/core/lanes.py: two webhook receivers are two lanes;
http://h, HTTP://h and http://user@h:80 are one) and THREADS in all, each on a daemon thread of its
own with its own database connection -- and claiming only what free slots allow
(jobs.effects.outbox.claim with `per_lane`). `pump()` claims and hands off; it
never waits for a call, so a lane that hangs holds its own slots until its call's total
deadline (jobs/effects/webhook.py), while every other target's intents are claimed and delivered.

Never: claims an intent it has no free slot for (its lease would run out while it waits); keeps
a claim across a crash -- the rows decide (jobs/effects/outbox.py).

Hazards: the call threads are daemons: a stopping process does not wait for calls in flight
(their claims' leases run out and the next relay reconciles them).
"""

import logging
import threading
from collections import Counter
from dataclasses import replace

from django.db import DatabaseError, connection

from jobs.effects import outbox

logger = logging.getLogger("jobs.outbox")

THREADS = 8  # calls in flight in all
PER_LANE = 2  # calls in flight for one lane (target + URL origin): a hanging one holds these


class Relay:
    def __init__(
        self,
        identity: str,
        threads: int = THREADS,
        per_lane: int = PER_LANE,
        lease_seconds: float = outbox.RELAY_LEASE_SECONDS,
    ) -> None:
        self.identity = identity
        self.threads = threads
        self.per_lane = per_lane
        self.lease_seconds = lease_seconds
        self.freed = threading.Event()  # set whenever a call ends: a slot may be free
        self._lock = threading.Lock()
        self._busy: Counter[str] = Counter()  # calls in flight by lane, as the rows store it

    def in_flight(self) -> dict[str, int]:
        with self._lock:
            return {t: n for t, n in self._busy.items() if n}

    def pump(self) -> int:
        """Claim as many due intents as free slots allow and start their calls; how many."""
        self.freed.clear()  # before reading the slots: a call ending from now on sets it again
        busy = self.in_flight()
        free = self.threads - sum(busy.values())
        if free <= 0:
            return 0
        claims = outbox.claim(
            self.identity, free, self.lease_seconds, per_lane=self.per_lane, busy=busy
        )
        for c in claims:
            with self._lock:
                self._busy[c.lane] += 1
            threading.Thread(
                target=self._handle, args=(c,), name=f"jobs-relay-{c.id}", daemon=True
            ).start()
        return len(claims)

    def _handle(self, c: outbox.Claim) -> None:
        try:
            try:
                outbox.handle(c, self.identity, self.lease_seconds)
            except DatabaseError:  # the connection died while the call was out: the row decides
                connection.close()  # ... read on a fresh one, while the claim is still ours
                unknown = outbox.still_claimed(c)
                if unknown is not None:  # as the next relay would: unknown -> reconciled
                    outbox.handle(replace(c, outcome_unknown=unknown), self.identity,
                                  self.lease_seconds)  # fmt: skip
        except DatabaseError as exc:  # the row keeps the truth: its lease runs out, reconciled
            logger.warning("relay: intent %s left to its lease (database error: %s)", c.key, exc)
        except Exception:  # noqa: BLE001  a bug in a target must not kill the relay
            logger.exception("relay: intent %s failed unexpectedly", c.key)
        finally:
            connection.close()  # this pool thread's own connection: never left open
            with self._lock:
                self._busy[c.lane] -= 1
            self.freed.set()
