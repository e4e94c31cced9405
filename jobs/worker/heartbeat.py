"""The drain's background thread: keeps held leases alive and hands successes over promptly.

Owns: periodic fenced lease extension for every job a drain holds (claimed, not yet ended);
confirming, at the next beat, that the handler now running is running (the reaper charges an
expired attempt only if it was confirmed); and flushing finished successes to the completer once
the oldest has waited FLUSH_SECONDS, so a quick job's commit never waits for a slow batch-mate --
or at once when the runner's batch ends (`commit_soon`: the commit overlaps the next claim;
jobs/worker/successes.py).

Never: decides a job's outcome. A heartbeat that changes zero rows is recorded by
transitions.heartbeat_many and flips the job's `lost` flag; the handler finds out cooperatively at
its next ctx.heartbeat()/ctx.checkpoint(), and the runner skips the commit.

Also watches the running handler's execution timeout: once it has run that long, the thread calls
the runner's `on_timeout` (which fails the attempt and ends the worker process, unless the handler
returned first: jobs/worker/running.py decides which, once).

Also watches for a stop (jobs.worker.shutdown) on behalf of the drain it serves: when one is
requested it calls the drain's `on_stop` once (the runner hands back the jobs not started), and
when its grace period is over, `on_grace_over` once (the runner hands back the rest and ends the
worker process).

Hazards: the thread has its own database connection (Django connections are per thread) and
closes it on exit. Every beat is bounded (jobs.core.connectivity), so a partition costs a beat,
never a hung thread. Any error in a beat is logged (once, then rate-limited) and retried with
backoff; the thread itself never dies of it, nor of a BaseException of user code it calls (a
hook's SystemExit; should it die all the same, it says so). When no beat has succeeded for half
of the shortest held lease, or the thread is dead, the leases are `at_risk`: the runner stops
starting jobs and hands the unstarted ones back. The commit's compare-and-set remains the last
word, so a missed beat can cost a lease, never correctness.
"""

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection

from jobs.context import Held
from jobs.core import transitions
from jobs.core.connectivity import OutageLog, bounded
from jobs.core.transitions import Claimed, Fence
from jobs.worker import shutdown
from jobs.worker.running import Running
from jobs.worker.successes import FLUSH_SECONDS, Commit, Finished, Successes

__all__ = ["FLUSH_SECONDS", "Finished", "Heartbeater"]

logger = logging.getLogger("jobs.heartbeat")

# A claimed job waiting behind a batch-mate whose handler has run this long is handed back (a
# fenced release: queued again in its place, the attempt uncharged) so that a free worker takes it:
# batching never holds a quick job behind a slow one for longer than about this plus LOOK.
HANDOFF_SECONDS = 0.1
LOOK_WHILE_WAITING_SECONDS = 0.02  # how often the thread looks while batch-mates wait
RETRY_SECONDS = (0.1, 2.0)  # backoff between failed beats: first, cap


class Heartbeater:
    def __init__(
        self,
        interval: float,
        commit: Commit,
        on_grace_over: Callable[["Heartbeater"], None] | None = None,
        on_stop: Callable[["Heartbeater"], None] | None = None,
        on_hand_off: Callable[[list[Held]], list[Held]] | None = None,
    ) -> None:
        self.interval = interval
        self._on_grace_over = on_grace_over
        self._on_stop = on_stop
        self._on_hand_off = on_hand_off
        self._waiting = False  # some held job is not started yet (read without the lock)
        self._held: dict[int, Held] = {}
        self._running = Running()  # the handler running now, and its execution timeout
        self._lock = threading.Lock()
        self._handing: set[int] = set()  # job ids whose hand-off is in flight
        self._hand_offs_settled = threading.Condition(self._lock)
        self._successes = Successes(self._lock, commit)
        self._hand_off_failures = 0  # in a row: the next try waits a backoff
        self._hand_off_not_before = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()  # stop, or a shorter lease: re-plan the next beat
        self._last_ok = time.monotonic()
        # Half the shortest lease ever held here: while the last good beat is more recent than
        # that, no held lease can be at risk (at_risk answers without looking at each one).
        self._min_half_lease = float("inf")
        self._thread = threading.Thread(target=self._run, name="jobs-heartbeat", daemon=True)
        self._over = False  # the thread ended: what at_risk reads per job (is_alive() locks)
        self.pipelined = connection.vendor == "postgresql"  # commit_soon hands commits over

    def __enter__(self) -> "Heartbeater":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.flush()
        finally:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=90)

    def hold(self, fence: Fence, lease_seconds: float) -> Held:
        return self.hold_many([(fence, lease_seconds)])[0]

    def hold_many(self, leases: Sequence[tuple[Fence, float]]) -> list[Held]:
        """Hold a batch's claimed attempts, each with its lease (one lock for the batch)."""
        now = time.monotonic()
        helds = [Held(fence, lease_seconds, now) for fence, lease_seconds in leases]
        if not helds:
            return helds
        shortest = min(h.lease_seconds for h in helds)
        with self._lock:
            for held in helds:
                self._held[held.fence.job_id] = held
            self._waiting = True
            self._min_half_lease = min(self._min_half_lease, shortest / 2.0)
            if shortest / 3.0 < self.interval:  # beat more often, now (not after this wait)
                self.interval = shortest / 3.0
                self._wake.set()
        return helds

    def release(self, fence: Fence) -> None:
        with self._lock:
            self._held.pop(fence.job_id, None)

    def start(self, held: Held, *running: Any) -> float | None:
        """The runner is about to run this job; None if it was handed back meanwhile. With
        `running` (timeout, on_timeout), its handler starts now (`running`, under the same lock;
        returns when), else 0.0. While its hand-off is in flight, waits for it (bounded round
        trips): a hand-off that failed leaves the job held, and the runner runs it after all."""
        with self._lock:
            while held.fence.job_id in self._handing:
                self._hand_offs_settled.wait(1.0)
            if self._held.get(held.fence.job_id) is not held:
                return None
            held.started = True
            return self._running.start(held, *running) if running else 0.0

    def running(
        self, held: Held, timeout: float | None, on_timeout: Callable[[], None] | None
    ) -> float:
        """Name the job whose handler runs now (returns when); with a `timeout`, the thread
        calls `on_timeout` once if it is still running then (jobs.worker.running). Not woken
        for it (a thread switch a job): it looks every FLUSH_SECONDS, then plans with it."""
        with self._lock:
            return self._running.start(held, timeout, on_timeout)

    def holds(self, held: Held) -> bool:
        with self._lock:
            return self._held.get(held.fence.job_id) is held

    def take_unstarted(self) -> list[Held]:
        """Take the held jobs the runner has not started (a stop: they are handed back now)."""
        with self._lock:
            taken = [h for h in self._held.values() if not h.started]
            for h in taken:
                del self._held[h.fence.job_id]
        return taken

    def returned(self, held: Held, success: Finished | None = None) -> bool:
        """The runner's handler of `held` returned (or raised): True if its attempt is still the
        runner's to end (a `success` then waits for its commit: `finished`), False if its timeout
        took it first (the thread fails it). Exactly one of this and `take_timed_out` has it."""
        with self._lock:
            ours = self._running.returned(held)
            if ours and success is not None:
                self._successes.add_locked(success)
            return ours

    def take_timed_out(self, held: Held) -> bool:
        """The running handler overran its timeout: take its job (the runner leaves it). False
        if the handler returned first: the runner ends that attempt, and the timeout is void."""
        with self._lock:
            taken = self._running.take(held)
            if taken:
                self._held.pop(held.fence.job_id, None)
            return taken

    def timed_out(self, held: Held) -> bool:
        with self._lock:
            return self._running.timed_out(held)

    def _hand_off_due(self, now: float) -> list[Held]:
        """Batch-mates not started while the running handler is past HANDOFF_SECONDS, for
        `on_hand_off` to give back. They stay held (and beaten) until that hand-back is decided:
        a failed one leaves them here, tried again after a backoff, or run by the runner."""
        if not self._waiting or self._on_hand_off is None or now < self._hand_off_not_before:
            return []
        with self._lock:
            waiting = [
                h
                for h in self._held.values()
                if not h.started and h.fence.job_id not in self._handing
            ]
            self._waiting = bool(waiting)
            if not waiting or self._running.held is None:
                return []
            if now - self._running.since < HANDOFF_SECONDS:
                return []
            self._handing.update(h.fence.job_id for h in waiting)
        return waiting

    def _hand_off(self, waiting: list[Held]) -> None:
        """Give `waiting` back; let go of those whose hand-back was decided, keep the rest."""
        decided: list[Held] = []
        try:
            if self._on_hand_off is not None:
                decided = self._on_hand_off(waiting)
        finally:
            gone = {h.fence.job_id for h in decided}
            with self._lock:
                for h in waiting:
                    self._handing.discard(h.fence.job_id)
                    if h.fence.job_id in gone and self._held.get(h.fence.job_id) is h:
                        del self._held[h.fence.job_id]
                if len(gone) < len(waiting):
                    self._waiting = True
                    self._hand_off_failures += 1
                    first, cap = RETRY_SECONDS
                    delay = min(cap, first * 2 ** min(self._hand_off_failures - 1, 10))
                    self._hand_off_not_before = time.monotonic() + delay
                else:
                    self._hand_off_failures = 0
                self._hand_offs_settled.notify_all()

    def finished(self, held: Held, claimed: Claimed, result: Any) -> None:
        """A success to commit soon (its lease beaten until then). The thread is not woken for
        it (a thread switch): it looks every FLUSH_SECONDS; a success waits at most twice that."""
        self._successes.add(Finished(held, claimed, result, time.monotonic()))

    def flush(self) -> None:
        """Commit every finished success now (from whichever thread calls). From any other
        thread than this one's, it returns once the successes handed over are committed too."""
        # Released before the commit: a zero-row beat racing the commit is then no evidence of
        # a lost lease; the commit's own fence decides.
        self._successes.commit(self._let_go, wait=threading.current_thread() is not self._thread)

    def _let_go(self, items: list[Finished]) -> None:
        for item in items:
            self._held.pop(item.held.fence.job_id, None)

    def commit_soon(self) -> None:
        """The runner's batch is over: this thread commits its successes at once while the
        runner claims the next batch (jobs.worker.successes; on PostgreSQL only -- SQLite has one
        writer at a time). While a hand-over waits behind the thread's commit on its way, the
        runner commits both, not waiting for that one (a drain's first opens the connection)."""
        if not (self.pipelined and self._thread.is_alive()):
            self.flush()
        elif not self._successes.hand_over():
            self._successes.commit(self._let_go, wait=False)
        elif self._successes.handed_over:
            self._wake.set()

    @property
    def at_risk(self) -> bool:
        """A held lease has gone unextended for half its length: it may be gone.

        Each lease counts from the later of the last successful beat and its own claim: a job
        with a short lease claimed just now is fresh, however long ago the last beat was (a
        drain that had run only long-lease jobs used to hand back a freshly claimed 2 s-lease
        job as "heartbeats failing", which broke bin/run's zombie drill). Always, once the
        thread has died: nothing extends a lease any more.
        """
        if self._over:
            return True  # started, and over (it logged its death; or the drain has ended)
        now, last_ok = time.monotonic(), self._last_ok
        if now - last_ok <= self._min_half_lease:
            return False  # each lease counts from last_ok or later: none is past half its length
        with self._lock:
            held = list(self._held.values())
        return any(now - max(last_ok, h.since) > h.lease_seconds / 2.0 for h in held)

    def beat_now(self) -> None:
        with self._lock:
            batch = list(self._held.values())
            running = self._running.held
            running = running if running is not None and not running.confirmed else None
            if running is not None and running in batch:
                # Flagged before the statement, so the runner never sees a confirmation the
                # database already has as missing (it commits a confirmed success at once).
                running.confirmed = True
            else:
                running = None
        if not batch:
            self._last_ok = time.monotonic()
            return
        try:
            with bounded(f"heartbeat of {len(batch)} jobs"):
                lost = transitions.heartbeat_many(
                    [(h.fence, h.lease_seconds) for h in batch],
                    running.fence if running else None,
                )
        except BaseException:
            if running is not None:
                running.confirmed = False  # not confirmed after all: the next beat tries again
            raise
        self._last_ok = time.monotonic()
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
            with bounded(f"record of job {fence.job_id}'s lost heartbeat"):
                transitions.record_lost_heartbeat(fence)

    def _next_deadline(self, last_beat: float) -> float:
        flush_at = self._successes.due_at()
        beat_at = last_beat + self.interval
        look = LOOK_WHILE_WAITING_SECONDS if self._waiting else FLUSH_SECONDS
        look_at = time.monotonic() + look  # successes finished meanwhile, batch-mates waiting
        due = min(beat_at, look_at) if flush_at is None else min(beat_at, flush_at)
        now = time.monotonic()
        for at in (self._running.deadline(), shutdown.grace_ends_at()):
            if at is not None and at > now:
                due = min(due, at)  # act on the moment, not a look later
        return due

    def held(self) -> list[Held]:
        """Take every held job out of this drain's hands (shutdown: they are handed back)."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
        return held

    def stopped(self, timeout: float) -> bool:
        """Wait up to `timeout` for the drain to end (its __exit__); True if it did."""
        return self._stop.wait(timeout)

    def _call(self, step: Callable[["Heartbeater"], None]) -> None:
        try:
            step(self)
        except BaseException:  # noqa: BLE001  the thread must outlive a failed shutdown step
            logger.exception("shutdown step failed; the leases decide what it did not settle")

    def _run(self) -> None:
        """The thread: every error of one step is logged and the thread goes on -- a
        BaseException too (a SystemExit raised by user code it calls: only the process's own
        os._exit, at a timeout or the end of a stop's grace, ends it, and that is no exception).
        Should it die all the same, it says so, and `at_risk` stops the drain claiming."""
        try:
            self._loop()
        except BaseException:
            logger.critical(
                "the drain's background thread died: its leases are no longer extended and the "
                "drain stops claiming (at_risk)",
                exc_info=True,
            )
        finally:
            self._over = True
            connection.close()

    def _loop(self) -> None:
        last_beat = time.monotonic()
        failures = OutageLog("heartbeat", logger)
        grace_handled = stop_handled = False
        while not self._stop.is_set():
            self._wake.wait(max(0.0, self._next_deadline(last_beat) - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                return
            if not stop_handled and self._on_stop and shutdown.requested():
                stop_handled = True
                self._call(self._on_stop)
            if not grace_handled and self._on_grace_over and shutdown.grace_over():
                grace_handled = True
                self._call(self._on_grace_over)  # may end the process
                continue
            now = time.monotonic()
            on_timeout = self._running.due(now)
            if on_timeout is not None:
                try:
                    on_timeout()  # ends the process (unless the handler returned first)
                except BaseException:  # noqa: BLE001  the thread must outlive a failed step
                    logger.exception("execution timeout: could not end the attempt")
                continue
            try:
                handed = self._hand_off_due(now)
                if handed:
                    self._hand_off(handed)
                if self._successes.due(now):
                    self.flush()
                if now >= last_beat + self.interval:
                    last_beat = now
                    self.beat_now()
                failures.recovered()
            except BaseException as exc:  # noqa: BLE001  the thread outlives any one error
                if isinstance(exc, Exception):
                    failures.failed(exc)  # once, then rate-limited: an outage repeats
                else:  # user code it called raised a SystemExit (say): loud, every time
                    logger.exception("drain's background thread: a step raised %r", exc)
                connection.close()
                # Retry sooner than a full interval, backing off while the failures last.
                last_beat = now - self.interval + failures.backoff(*RETRY_SECONDS)
