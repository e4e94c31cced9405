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
and delivered.

Every call, whatever its target, is *overdue* at CALL_DEADLINE: `pump()` frees its thread slot
(the thread runs on, still counted in its lane: jobs/effects/slots.py) but the intent keeps its
claim -- the relay renews its lease while the call's thread is alive -- so it is never reconciled
or performed again, by this relay or another, while that call may still land. When the thread
ends, the call's own marks decide (performed, refused, unknown: under its token, as for any
call); one that ended without a mark (a database error, a bug) is handed back then, as an
unknown outcome under its claim's token, and the next try reconciles against a target that has
settled. Why this and not the alternatives:
- handing the intent back at the deadline (as before) let the retry ask the target while the
  first call was still out: "not yet", truthfully, then perform -- and the first call landed
  too: twice, for exactly the targets that neither check tokens nor deduplicate;
- handing it back but skipping it in this relay's claims while its thread lives guards this
  process only: another scheduler's relay claims it after the backoff and does the same;
- leaving it to its lease (not renewed) only moves the same race to the lease's end.
Holding the claim guards every relay, needs no new state (the row's lease, as for any call),
and costs the lane nothing it did not already pay: the thread counts in its lane either way.

Bounds: a call that hangs for good keeps its intent claimed (`performing`) for as long as this
process lives -- accepted: any other choice performs it again with the first call still able to
land. The operator sees it: a warning at the deadline and every REMIND_SECONDS while it stays
out, the row's `last_error` ("past the relay's ... deadline") and `relay`, and the outbox's
oldest-pending age in /metrics; restarting the scheduler process ends it (its threads die, the
lease runs out, the next relay reconciles). Past MAX_ABANDONED such threads they count against
THREADS again (jobs/effects/slots.py).

Never: claims an intent it has no free slot for (its lease would run out while it waits); keeps
a claim across a crash -- the rows decide (jobs/effects/outbox.py).

Hazards: the call threads are daemons: a stopping process does not wait for calls in flight
(their claims' leases run out and the next relay reconciles them). A stopped relay whose process
lives on (the handlers' shutdown grace) hands the calls still out to `keep_claims`, which renews
their claims until their threads end or the process exits. The renewals are the relay's
own: a relay process stopped (SIGSTOP), or cut from the database, for longer than the lease loses
the claim with its call still out, and the next relay may reconcile and perform while that call
can still land -- only a target that keeps the receiver contract (a lower token refused,
docs/effects.md) is safe from that. `wait()` wakes `pump()` in time for deadlines and renewals.
"""

import logging
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError, connection

from jobs.effects import outbox, targets
from jobs.effects.slots import Slots

logger = logging.getLogger("jobs.outbox")

THREADS = 8  # calls in flight in all
PER_LANE = 2  # calls in flight for one lane (target + URL origin): a hanging one holds these
RESERVED = 2  # of THREADS, only for lanes with no slow call, one call of a lane at a time
SLOW_SECONDS = 2.0  # a call in flight this long makes its lane slow ...
SLOW_MEMORY = 600.0  # ... until this long after it was last seen slow
# How long any target's call may hold a thread slot, from its claim or its perform's lease
# renewal: past it the slot is freed and the relay renews the intent's lease itself, every third
# of a lease, until the call's thread ends (never taken over from a call in flight by lease
# expiry). Above the webhook's own total deadline (25 s at most), well below the lease.
CALL_DEADLINE = 30.0
REMIND_SECONDS = 600.0  # an overdue call still out is logged again this often


@dataclass
class _InFlight:
    claim: outbox.Claim  # the claim the call runs under (its token)
    since: float  # monotonic: its claim, or its latest lease renewal
    overdue: bool = False  # past the deadline: its slot freed, its lease renewed by the relay
    renewed: float = 0.0  # monotonic: the relay's latest renewal of an overdue call's lease
    noted: bool = False  # the row says so (outbox.keep_claim's first renewal)
    reminded: float = 0.0  # monotonic: when it was last logged as still out
    lost: bool = False  # a renewal found the claim gone (taken over, or decided by the call)


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
        self._calls: dict[int, _InFlight] = {}  # by slot handle, until its thread ends

    def in_flight(self) -> dict[str, int]:
        """Calls in flight by lane, as the rows store it."""
        return self.slots.in_flight()

    def overdue(self) -> list[str]:
        """The keys of intents whose call is out past the deadline (their thread still alive)."""
        with self._lock:
            return sorted(f.claim.key for f in self._calls.values() if f.overdue)

    def pump(self) -> int:
        """Claim as many due intents as free slots allow and start their calls; how many. The
        open threads first, then the reserved ones (jobs/effects/slots.py) -- only once the open
        ones are full: an open claim that found fewer intents than it had room for took what
        was due, and intents committed since then go to the next pump's open threads. (Read
        between the two claims, a burst went to the reserve first: lanes not yet seen slow took
        both reserved threads while open ones stood free, and if they hung, a healthy lane's
        intent waited for their deadline.)"""
        self.freed.clear()  # before reading the slots: a call ending from now on sets it again
        self._mind_overdue()
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
            if len(claims) < plan.limit:
                break  # room left where it claimed: nothing more was due (the reserve waits)
        return started

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` for a call to end, or until a call's deadline or an overdue
        call's lease renewal is due (pump() then)."""
        now, renew = time.monotonic(), self.lease_seconds / 3
        with self._lock:
            due = [
                f.renewed + renew if f.overdue else f.since + self.call_deadline
                for f in self._calls.values()
                if not f.lost
            ]
        self.freed.wait(max(0.0, min([timeout, *(d - now for d in due)])))

    def keep_claims(self) -> None:
        """The relay has stopped claiming (its scheduler stops) and its process lives on -- the
        grace its handlers get, up to SHUTDOWN_GRACE_SECONDS: the calls still out keep their
        intents claimed, their leases renewed on a daemon thread of its own until their threads
        end. At the process's exit it dies with them; the leases then run out as after a crash."""
        with self._lock:
            if not self._calls:
                return
        keeper = threading.Thread(target=self._keep_until_calls_end, name="jobs-relay-keeper")
        keeper.daemon = True
        keeper.start()

    def _keep_until_calls_end(self) -> None:
        try:
            while True:
                self.freed.clear()  # before reading the calls: one ending from now on sets it
                with self._lock:
                    if not self._calls:
                        return
                try:
                    self._mind_overdue()
                except targets.STOPS:  # a stop of this process: never caught
                    raise
                except BaseException:  # noqa: BLE001  a bug: tried again, the claims are at stake
                    logger.exception("relay: the claims of calls still out were not renewed")
                    connection.close()
                    self.freed.wait(self.lease_seconds / 10)
                    continue
                self.wait(self.lease_seconds / 3)
        finally:
            connection.close()

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
            self._ended(handle, recorded=True)  # not_started() records it
            why = f"its call's thread did not start: {type(exc).__name__}: {exc}"
            try:
                outbox.not_started(c, self.identity, why)
            except DatabaseError as db:  # the row keeps the truth: its lease runs out
                connection.close()
                logger.warning("relay: intent %s left to its lease (%s; %s)", c.key, why, db)
            return False

    def _renewed(self, handle: int, c: outbox.Claim) -> None:
        """`c`'s lease was renewed for its next call (or claimed again under a higher token):
        its deadline starts again, unless it is already overdue (then only its claim changes:
        the relay renews that one)."""
        with self._lock:
            call = self._calls.get(handle)
            if call is not None and call.overdue:
                call.claim, call.lost = c, False
            elif call is not None:
                self._calls[handle] = _InFlight(c, time.monotonic())

    def _ended(self, handle: int, recorded: bool) -> None:
        """The call's thread ended: an overdue call that recorded nothing is handed back now,
        before its lane's slot is freed (it is still claimed: nobody could call it meanwhile)."""
        with self._lock:
            call = self._calls.pop(handle, None)
        try:
            if call is not None and call.overdue and not recorded and not call.lost:
                self._hand_back(call.claim)
        finally:
            self.slots.end(handle)

    def _hand_back(self, c: outbox.Claim) -> None:
        try:
            outbox.ended_past_deadline(c, self.identity, self.call_deadline)
        except DatabaseError as exc:  # the row keeps the truth: its lease runs out
            logger.warning("relay: intent %s left to its lease (%s)", c.key, exc)
        finally:
            connection.close()

    def _mind_overdue(self) -> None:
        """Free the thread slot of every call out past the deadline (a target that hangs: its
        thread cannot be stopped; jobs/effects/slots.py still counts it in its lane) and keep
        its intent claimed: noted on the row, its lease renewed every third of a lease. Each
        intent's own write: one failing stops no other."""
        now, renew = time.monotonic(), self.lease_seconds / 3
        due: list[_InFlight] = []
        with self._lock:
            for handle, call in self._calls.items():
                if call.lost or (call.overdue and now - call.renewed < renew):
                    continue
                if call.overdue or now - call.since > self.call_deadline:
                    due.append(call)
                    if not call.overdue:
                        call.overdue = True
                        self.slots.abandon(handle)
        for call in due:
            self._keep(call, now)

    def _keep(self, call: _InFlight, now: float) -> None:
        c, first = call.claim, not call.noted
        try:
            noted = self.call_deadline if first else None
            kept = outbox.keep_claim(c, self.identity, self.lease_seconds, noted)
        except DatabaseError as exc:  # tried again soon, well within the lease
            connection.close()
            logger.warning("relay: intent %s: its lease was not renewed (%s)", c.key, exc)
            with self._lock:
                call.renewed = now - self.lease_seconds / 3 + self.lease_seconds / 10
            return
        with self._lock:
            call.renewed, call.noted = now, True
            gone = kept != "kept" and call.claim is c  # not claimed anew by its thread meanwhile
            call.lost = call.lost or gone
            remind = first or now - call.reminded >= REMIND_SECONDS
            if remind:
                call.reminded = now
        if gone and kept == "taken-over":
            logger.warning(
                "relay: intent %s: its claim was taken over while its call (out %.0f s) may "
                "still land (a relay stalled past its lease: only a token check stops it)",
                c.key,
                now - call.since,
            )
        elif remind and not gone:
            logger.warning(
                "relay: intent %s: no answer within %g s (out %.0f s): its thread slot is freed, "
                "the intent stays claimed until its call ends (restarting this process ends it)",
                c.key,
                self.call_deadline,
                now - call.since,
            )

    def _handle(self, c: outbox.Claim, handle: int) -> None:
        def renewed(claim: outbox.Claim) -> None:
            self._renewed(handle, claim)

        recorded = False  # the call marked its intent (or found it decided or taken over)
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
            recorded = True
        except DatabaseError as exc:  # the row keeps the truth: its lease runs out, reconciled
            logger.warning("relay: intent %s left to its lease (database error: %s)", c.key, exc)
        except targets.STOPS:  # a stop of this process: never caught
            raise
        except BaseException:  # noqa: BLE001  a bug (a SystemExit too): this intent's alone
            logger.exception("relay: intent %s failed unexpectedly", c.key)
        finally:
            try:
                connection.close()  # this pool thread's own connection: never left open
            finally:  # the slot is freed whatever closing did
                self._ended(handle, recorded)
                self.freed.set()
