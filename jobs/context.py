"""The handler's `ctx`: the user's API of a running attempt -- identity, payload, fenced writes.

Owns: `JobContext`, what a handler may do while it runs, and `Held`, what a drain holds for one
claimed attempt. Never: commits -- the runner does, once, after the handler returns. Staged
outputs, effects, intents and token-checked writes live in jobs/effects; the methods here bind
them to this attempt's fence. Its own room above jobs/effects and beside jobs/ops: the worker
builds a context, nothing below imports it back, and a handlers module (imported by the web
process too) can import it for type hints without importing the worker.

Hazards: a handler may call ctx.heartbeat()/ctx.checkpoint() inside its own
`transaction.atomic()`. A fenced write must never join that transaction (the job row's lock would
last as long as the handler's transaction, blocking the drain's heartbeat and the reaper, and a
rollback would erase the RejectedWrite record), so such a call runs on a connection of its own,
in a side thread: Django's connections are per thread. Except on SQLite, whose one writer is the
handler's transaction itself: there the write joins it as a savepoint (see
transitions.joining_callers_transaction), and a rejection it meets is recorded by the completer
after the handler's transaction is over.
"""

import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connection

from jobs.core import bounds, transitions
from jobs.core.conf import jobs_settings
from jobs.core.connectivity import bounded
from jobs.core.exceptions import AttemptEnded, LeaseLost
from jobs.core.sql.rows import JSONText
from jobs.core.states import Write
from jobs.core.transitions import Fence
from jobs.effects import fenced, fenced_rows, in_flight, outbox, pending, staging
from jobs.effects import keys as effects

logger = logging.getLogger("jobs.fencing")

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


# Rejections a handler met inside its own transaction on SQLite, recorded by the completer once
# that transaction is over (its rollback would have erased them): fence -> how to record it.
_unrecorded: dict[Fence, Callable[[], None]] = {}
_unrecorded_lock = threading.Lock()


def record_unrecorded_rejection(fence: Fence) -> None:
    """Record the rejection this attempt met inside its handler's transaction, if any."""
    with _unrecorded_lock:
        record = _unrecorded.pop(fence, None)
    if record is not None:
        record()


def _outside_callers_transaction(
    write: Callable[[], None], fence: Fence, deadline: bool = True
) -> None:
    """`deadline`: bound the write's round trips (jobs.core.connectivity) -- not for a write that
    also moves a file through storage (ctx.stage), which may rightly take longer than that."""
    if not connection.in_atomic_block:
        if not deadline:
            write()
            return
        # Bounded (jobs.core.connectivity): a partition fails the write instead of hanging the
        # handler.
        with bounded("a handler's fenced write"):
            write()
        return
    if connection.vendor == "sqlite":
        # One writer: another connection could not write before the handler's COMMIT.
        try:
            with transitions.joining_callers_transaction():
                write()
        except LeaseLost as lost:
            write_ = lost.write
            with _unrecorded_lock:
                _unrecorded[fence] = lambda: transitions.record_rejected(fence, write_)
            raise
        return

    def on_own_connection() -> None:
        connection.close_if_unusable_or_obsolete()
        if not deadline:  # inside the handler's transaction as outside it (ctx.stage)
            write()
            return
        with bounded("a handler's fenced write"):
            write()

    _side_used.set()
    _side_writer.submit(on_own_connection).result()


def refused_at_commit(ctx: "JobContext", exc: BaseException) -> bool:
    """Whether the handler failed because its own transaction's COMMIT refused a token-checked
    write (its job taken over between the write and the COMMIT: jobs/core/sql/fenced.py). If so,
    the refusal is recorded like a refused UPDATE (write `token_write`) and the attempt is lost:
    its work is discarded, never written as the job's failure."""
    label = fenced.refused_at_commit(exc)
    if label is None:
        return False
    fence = ctx._held.fence
    ctx._held.lost.set()
    try:
        _outside_callers_transaction(
            lambda: fenced.record_rejection(fence, Write.TOKEN, label, None), fence
        )
    except Exception:  # noqa: BLE001  the attempt is lost all the same; the drain goes on
        logger.exception(
            "job %s attempt %s: could not record its refused COMMIT", fence.job_id, fence.attempt
        )
    return True


class Flag:
    """Set once, read by any thread: whether an attempt's lease is lost. What a
    `threading.Event` offers here without its Condition and lock, made per claimed job (nobody
    waits on it: in_flight looks every LOOK_SECONDS)."""

    __slots__ = ("up",)

    def __init__(self) -> None:
        self.up = False  # what is_set() answers: read as an attribute in per-job loops

    def set(self) -> None:
        self.up = True

    def is_set(self) -> bool:
        return self.up


class Held:
    """What a drain holds for one claimed attempt: its fence and lease, and whether it is lost.

    Shared by the runner (which creates it), the heartbeat thread (which extends the lease and
    sets `lost` when a beat changes zero rows) and the handler's context (which checks `lost`).
    A plain class with its __init__ written out and its fields in slots: one is made per
    claimed job on the drain's path, where a dataclass's default factories cost a third more
    and an instance dict filled field by field a quarter (the `__dict__` slot is for `steps`,
    made at a first effect).
    """

    __slots__ = (
        "fence",
        "lease_seconds",
        "lost",
        "confirmed",
        "since",
        "started",
        "work",
        "__dict__",
        "__weakref__",
    )

    def __init__(self, fence: Fence, lease_seconds: float, since: float | None = None) -> None:
        self.fence = fence
        self.lease_seconds = lease_seconds
        self.lost = Flag()
        # A beat (or the runner's explicit write) has marked this attempt's handler as running.
        # A confirmed attempt would be charged if it expired, so its success is committed at once.
        self.confirmed = False
        # time.monotonic() when the drain took it over: the claim had just set its lease, so the
        # lease is fresh from then whether or not a beat has run since (a batch's: read once).
        self.since = time.monotonic() if since is None else since
        self.started = False  # the runner took it to run (see Heartbeater.start)
        # Its staged outputs and intents until its final write (jobs/effects/pending.py), made
        # at its first record; forget() ends it: a record from a leaked thread is refused then.
        self.work: pending.AttemptWork | None = None

    def __repr__(self) -> str:
        return f"Held({self.fence!r}, {self.lease_seconds!r})"

    @property
    def steps(self) -> in_flight.Steps:
        """Its effect steps in flight: one thread of the attempt in a step at a time
        (in_flight.py). Made at its first effect, not per claim (a Condition a job on the drain's
        path); dict.setdefault is atomic, so threads racing to make it share one."""
        made = self.__dict__.get("_steps")
        return made if made is not None else self.__dict__.setdefault("_steps", in_flight.Steps())


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
            _outside_callers_transaction(action, self._held.fence)
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
        plain JSON the database can store or is larger than JOBS['MAX_PAYLOAD_BYTES']. The
        text checked is the text stored (encoded once, like a result).
        """
        text = bounds.json_text(progress, jobs_settings().MAX_PAYLOAD_BYTES, what="progress")
        fence, lease, checked = self._held.fence, self._held.lease_seconds, JSONText(text)
        self._fenced(Write.CHECKPOINT, lambda: transitions.checkpoint(fence, checked, lease))

    # -- every write path beyond the job row (the effects issue) -------------------------------

    def stage(self, name: str, content: Any) -> str:
        """Write `content` (bytes, str or a file) as this attempt's output `name`.

        Stored at `jobs/<job_id>/attempt-<n>/<name>` in `JOBS["STAGING_STORAGE"]` (a name staged
        again: beside it, as `<stem>~<7 random><ext>`); the commit points `Job.result_ref` at
        this attempt's outputs. Returns the storage name.
        """
        self._raise_if_lost("stage")
        pending.check_open(self._held, "stage")  # before the file: the attempt ended
        done: list[staging.Staged] = []
        _outside_callers_transaction(
            lambda: done.append(staging.stage(self._held.fence, name, content)),
            self._held.fence,
            deadline=False,
        )
        ref = done[0].ref
        if done[0].replaced and pending.staged(self._held):
            # The database let the replacement in while the attempt ran, and the attempt had
            # staged before: its commit, if it read the work meanwhile, named this prefix.
            return ref
        try:
            pending.mark_staged(self._held)
        except AttemptEnded:  # it ended while the file was written: not what its commit named
            staging.written_too_late(self._held.fence, ref)
            raise
        return ref

    def effect(self, step: str, fn: Callable[[str], Any]) -> Any:
        """Perform `fn(key)` at most once per (job, step); key = "<job_id>:<step>".

        On a later attempt the recorded result is returned without calling `fn` (counted as
        deduplicated). If an earlier attempt started `fn` but never recorded completion, `fn` is
        called again with the same key: the receiver must deduplicate by it (else use intent()).
        """
        effects.checked_step(step)
        self._raise_if_lost("effect")
        # Another thread of this attempt in the step: wait for it (then its recorded result).
        with self._held.steps.one(step, self._held.lost, lambda: self._raise_if_lost("effect")):
            return self._effect(step, fn)

    def _effect(self, step: str, fn: Callable[[str], Any]) -> Any:
        begun: list[effects.Begun] = []
        fence = self._held.fence
        self._fenced("effect", lambda: begun.append(effects.begin(fence, step)))
        if begun[0].done:
            return begun[0].result
        result = effects.checked_result(fn(begun[0].key))
        # Presented even if the lease was lost meanwhile: the ledger row decides, and recording
        # that the effect happened is the truth a later attempt needs.
        recorded: list[Any] = []
        try:
            _outside_callers_transaction(
                lambda: recorded.append(effects.finish(fence, begun[0].key, result)), fence
            )
        except LeaseLost:
            self._held.lost.set()
            raise
        return recorded[0]

    def _outside_transaction(self, write: Callable[[], None]) -> None:
        """Run `write`, one of the platform's own short writes for this attempt (send_mail's
        ledger mark), never inside the handler's transaction: like the ledger's begin and finish.
        Fenced like them: a refusal (LeaseLost) marks the attempt lost."""
        self._fenced("effect", write)

    def intent(self, step: str, target: str, data: Any) -> None:
        """Record an outbox intent; it exists only if this attempt's commit is accepted."""
        self._raise_if_lost("intent")
        pending.add_intent(self._held, outbox.intent(step, target, data, self.job_id))

    def fenced_write(self, queryset: Any, **values: Any) -> int:
        """Update every row of `queryset` (a FencedRow model) while this attempt owns the job.

        Decided in the UPDATE itself: accepted only while this attempt is the job's current one
        and the job is running, and no row was written by a higher attempt of this job. All or
        nothing: a refusal changes no row, is recorded (write `token_write`, the rows named) and
        raises LeaseLost. Returns the rows updated. At most fenced.MAX_ROWS rows per call.
        """
        self._raise_if_lost(Write.TOKEN)
        return self._decided(fenced.write(self._held.fence, queryset, **values)).updated

    def fenced_create(self, model: Any, **values: Any) -> Any:
        """Insert one row of `model` (a FencedRow model) while this attempt owns the job, and
        return the instance (like `Model.objects.create`, without `save()` or its signals).

        Decided in the INSERT itself, like fenced_write: else nothing is inserted, the refusal
        is recorded and LeaseLost raised. A duplicate of a unique value is the IntegrityError
        it always is.
        """
        self._raise_if_lost(Write.TOKEN)
        created = fenced_rows.create(self._held.fence, model, [values])
        self._decided(created.decision)
        return created.instances[0]

    def fenced_bulk_create(self, model: Any, rows: Any) -> list[Any]:
        """fenced_create() for each mapping of `rows`: all of them or none. At most
        fenced.MAX_ROWS rows per call."""
        self._raise_if_lost(Write.TOKEN)
        rows = list(itertools.islice(rows, fenced.MAX_ROWS + 1))  # the bound, before memory
        created = fenced_rows.create(self._held.fence, model, rows)
        self._decided(created.decision)
        return created.instances

    def fenced_delete(self, queryset: Any) -> int:
        """Delete every row of `queryset` (a FencedRow model) while this attempt owns the job,
        and none last written by a higher attempt of it: all or nothing, like fenced_write.
        Returns the rows deleted (the queryset's own; cascades go with them)."""
        self._raise_if_lost(Write.TOKEN)
        return self._decided(fenced_rows.delete(self._held.fence, queryset)).updated

    def _decided(self, decision: fenced.TokenDecision) -> fenced.TokenDecision:
        """`decision` if accepted; else it is recorded and LeaseLost raised."""
        if not decision.refused:
            return decision
        fence = self._held.fence
        current = fence.attempt if decision.attempt_current is None else decision.attempt_current

        def record() -> None:
            fenced.record_rejection(fence, Write.TOKEN, decision.resource, current)

        self._held.lost.set()
        if connection.vendor == "sqlite" and connection.in_atomic_block:
            # The handler's own transaction holds SQLite's one write lock: recorded by the
            # completer once that transaction is over (its rollback would erase it here).
            with _unrecorded_lock:
                _unrecorded[fence] = record
        else:
            _outside_callers_transaction(record, fence)
        raise LeaseLost(self.job_id, self.attempt, Write.TOKEN)

    def __repr__(self) -> str:
        return f"<JobContext {self.kind}#{self.job_id} attempt {self.attempt}>"
