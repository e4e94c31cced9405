"""Statements shared by both vendors, the row types they return, and the driver interface.

Owns: SQL text (with jobs/core/sql/postgres.py and jobs/core/sql/sqlite.py). Never: decides
anything or opens transactions -- jobs/core/transitions calls these inside its own transaction and
interprets the row counts.

Hazards, and why the statements look the way they do:
- Every write after a claim is one conditional statement `WHERE id = ? AND attempt = ? AND
  state = ?`; under READ COMMITTED PostgreSQL re-evaluates that WHERE against the newest row
  version after waiting on a concurrent writer, so exactly one of two racing writers wins.
- Time is the database's: `clock_timestamp()` (not `now()`, which is frozen at BEGIN). Workers
  never compare leases with their own clock.
- An attempt's outcome is written once: only a row still `running` is closed, so what happened
  first (expired, say) is never overwritten by what a zombie tried later.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.backends.utils import CursorWrapper

from jobs.core.sql import queues as queues_sql
from jobs.core.sql.rows import (  # noqa: F401 -- the row types, re-exported for the drivers
    ClaimedRow,
    CommitRow,
    ExpiredRow,
    FenceRow,
    IntentRow,
    claimed_rows,
    commit_arrays,
    dumps,
    expiry_evidence,
    fetch_claimed,
    loads,
)
from jobs.core.states import AttemptOutcome, EventType, JobState

RUNNING = JobState.RUNNING.value
QUEUED = JobState.QUEUED.value
OPEN = AttemptOutcome.RUNNING.value

JOB_COLUMNS = "id, attempt, kind, payload, max_attempts, lease_seconds, attempts_released"


def queue_filter(queues: Sequence[str] | None, params: dict[str, Any]) -> str:
    if not queues:
        return ""
    names = []
    for i, q in enumerate(queues):
        params[f"q{i}"] = q
        names.append(f"%(q{i})s")
    return f" AND queue IN ({', '.join(names)})"


def lease_expression(
    kind_leases: Mapping[str, float], params: dict[str, Any], table: str = ""
) -> str:
    """The lease a claim sets: the job's own, else its handler's, else the default `%(lease)s`.

    Handler leases are registry data, not columns, so they enter the statement as a CASE over
    the kinds that have one (a handful) -- the first lease is then the right one.
    """
    if not kind_leases:
        return f"COALESCE({table}lease_seconds, %(lease)s)"
    arms = []
    for i, (kind, lease) in enumerate(sorted(kind_leases.items())):
        params[f"k{i}"], params[f"kl{i}"] = kind, float(lease)
        arms.append(f"WHEN %(k{i})s THEN %(kl{i})s")
    return f"COALESCE({table}lease_seconds, CASE {table}kind {' '.join(arms)} END, %(lease)s)"


class Driver:
    """Statements shared by both vendors; vendor drivers fill in the clock and the hot path."""

    now = ""  # SQL expression of the database clock
    # True when every transition run under transitions.fenced_statement() -- claim, heartbeat,
    # checkpoint, confirm_running, commit, fail, release, reclaim_expired, poison -- is one
    # statement: they then run in autocommit, so one of several statements would commit alone.
    single_statement_writes = False
    # Appended to a SELECT that locks the row it reads until the transaction ends. SQLite has no
    # FOR UPDATE: its transactions are IMMEDIATE (settings), so the one write lock is held anyway.
    lock_row = ""
    # Appended to a SELECT of a job row that a row referencing it is about to be inserted for:
    # held to the end of the transaction (the lock the foreign key's check at COMMIT takes, taken
    # before the insert). A prune then skips that job, or this waits for the prune and finds the
    # job gone, never an IntegrityError at COMMIT (jobs.ops.retention).
    key_share = ""
    # True when the database delivers LISTEN/NOTIFY wake-ups (PostgreSQL); SQLite's workers poll.
    listen_notify = False
    # Queued rows in jobs_job_pick_idx (not deferred far ahead), as each vendor spells it.
    pickable = "NOT deferred"
    # A CTE (trailing comma) that brings rows deferred far ahead into the pick index as they come
    # near (PostgreSQL's claim starts with it too); "" where nothing is deferred (SQLite).
    promote = ""

    def later(self, seconds_param: str) -> str:
        raise NotImplementedError

    def seconds_between(self, later: str, earlier: str) -> str:
        """SQL for the seconds from timestamp expression `earlier` to `later`."""
        raise NotImplementedError

    def seconds_since(self, column: str) -> str:
        return self.seconds_between(self.now, column)

    # -- reads --------------------------------------------------------------------------------

    def count_due(self, cur: CursorWrapper, limit: int, queues: Sequence[str] | None) -> int:
        """Due jobs a claim could take now (not in a paused queue or one at its limit).

        It promotes rows deferred far ahead first, as a claim does: the claims of standing
        drains are not the only ones to (with JOBS_IDLE_WAIT_SECONDS = 0 none stand, and a job
        enqueued more than the horizon ahead stayed out of the pick index, never counted due).
        The promoted rows are counted from the next tick on, long before they are due."""
        params: dict[str, Any] = {"limit": limit}
        guard = queues_sql.claim_guard(None, params)
        cur.execute(
            f"WITH {self.promote}{guard} due AS (SELECT 1 FROM jobs_job "
            f"WHERE state = '{QUEUED}' AND {self.pickable} AND run_at <= {self.now}"
            f"{queue_filter(queues, params)}{queues_sql.BLOCKED} LIMIT %(limit)s) "
            "SELECT count(*) FROM due",
            params,
        )
        return int(cur.fetchone()[0])

    def due_ids(self, cur: CursorWrapper, limit: int, queues: Sequence[str] | None) -> list[int]:
        params: dict[str, Any] = {"limit": limit}
        cur.execute(
            f"SELECT id FROM jobs_job WHERE state = '{QUEUED}' AND {self.pickable} "
            f"AND run_at <= {self.now}{queue_filter(queues, params)} "
            "ORDER BY priority DESC, run_at, id LIMIT %(limit)s",
            params,
        )
        return [int(r[0]) for r in cur.fetchall()]

    def find_expired(self, cur: CursorWrapper, limit: int) -> list[ExpiredRow]:
        cur.execute(
            "SELECT j.id, j.attempt, j.kind, j.max_attempts, j.attempts_released, "
            "a.running_confirmed_at IS NOT NULL, COALESCE(a.worker, ''), "
            "j.lease_expires_at, j.heartbeat_at "
            "FROM jobs_job j LEFT JOIN jobs_attempt a ON a.job_id = j.id AND a.number = j.attempt "
            f"WHERE j.state = '{RUNNING}' AND j.lease_expires_at < {self.now} "
            "ORDER BY j.lease_expires_at LIMIT %(limit)s",
            {"limit": limit},
        )
        return [ExpiredRow(*r) for r in cur.fetchall()]

    def find_held_by(
        self, cur: CursorWrapper, owner: str, gone_for: float, limit: int
    ) -> list[ExpiredRow]:
        """Running jobs whose current attempt is still open on worker `owner`, claimed more than
        `gone_for` seconds ago (before its process was seen dead): what a rescue may release."""
        cur.execute(
            "SELECT j.id, j.attempt, j.kind, j.max_attempts, j.attempts_released, "
            "a.running_confirmed_at IS NOT NULL, a.worker, j.lease_expires_at, j.heartbeat_at "
            "FROM jobs_job j JOIN jobs_attempt a ON a.job_id = j.id AND a.number = j.attempt "
            f"WHERE j.state = '{RUNNING}' AND a.worker = %(owner)s AND a.outcome = '{OPEN}' "
            f"AND a.claimed_at <= {self.later('ago')} ORDER BY j.id LIMIT %(limit)s",
            {"owner": owner, "ago": -gone_for, "limit": limit},
        )
        return [ExpiredRow(*r) for r in cur.fetchall()]

    def owner_exited(self) -> str:
        """The rescue's guard, in place of the lease's expiry: the job's current attempt is
        still open on %(owner)s and was claimed before that process was seen dead."""
        return (
            "EXISTS (SELECT 1 FROM jobs_attempt o WHERE o.job_id = %(id)s "
            "AND o.number = %(attempt)s AND o.worker = %(owner)s "
            f"AND o.outcome = '{OPEN}' AND o.claimed_at <= {self.later('ago')})"
        )

    def read_attempt_outcome(self, cur: CursorWrapper, job_id: int, attempt: int) -> str | None:
        cur.execute(
            "SELECT outcome FROM jobs_attempt WHERE job_id = %(id)s AND number = %(attempt)s",
            {"id": job_id, "attempt": attempt},
        )
        row = cur.fetchone()
        return row[0] if row else None

    # -- writes that are not on the hot path: same SQL on both vendors ----------------------------

    def record_rejection(
        self, cur: CursorWrapper, job_id: int, attempt: int, worker: str, write: str
    ) -> tuple[int, str, int] | None:
        """Insert the rejected write and its event; (attempt, state) of the job now and the
        row's id, or None when the job is gone (or being pruned: `key_share`)."""
        params: dict[str, Any] = {
            "id": job_id,
            "attempt": attempt,
            "worker": worker,
            "write": write,
        }
        cur.execute(
            "INSERT INTO jobs_rejectedwrite "
            "(job_id, attempt_presented, attempt_current, state_current, worker, write, at) "
            f"SELECT id, %(attempt)s, attempt, state, %(worker)s, %(write)s, {self.now} "
            f"FROM jobs_job WHERE id = %(id)s{self.key_share} "
            "RETURNING attempt_current, state_current, id",
            params,
        )
        row = cur.fetchone()
        if row is None:
            return None
        data = dumps({"write": write, "attempt_current": row[0], "state_current": row[1]})
        self.insert_event(cur, job_id, attempt, EventType.REJECTED, worker, data)
        return int(row[0]), row[1], int(row[2])

    def job_now(self, cur: CursorWrapper, job_id: int) -> tuple[int, str] | None:
        """The job's (attempt, state), its row held as `key_share` says; None: the job is gone."""
        cur.execute(f"SELECT attempt, state FROM jobs_job WHERE id = %s{self.key_share}", [job_id])
        row = cur.fetchone()
        return (int(row[0]), row[1]) if row else None

    def rejection_exists(self, cur: CursorWrapper, row_id: int) -> bool:
        cur.execute("SELECT 1 FROM jobs_rejectedwrite WHERE id = %s", [row_id])
        return cur.fetchone() is not None

    def end_attempt(self, cur: CursorWrapper, job_id: int, attempt: int, outcome: str) -> None:
        """Close an attempt row that is still open; a settled outcome is never overwritten."""
        cur.execute(
            f"UPDATE jobs_attempt SET outcome = %(outcome)s, ended_at = {self.now} "
            f"WHERE job_id = %(id)s AND number = %(attempt)s AND outcome = '{OPEN}'",
            {"id": job_id, "attempt": attempt, "outcome": outcome},
        )

    def insert_event(
        self, cur: CursorWrapper, job_id: int, attempt: int, type_: str, worker: str, data: str
    ) -> None:
        cur.execute(
            "INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data) "
            f"VALUES (%(id)s, %(attempt)s, %(type)s, %(worker)s, {self.now}, %(data)s)",
            {"id": job_id, "attempt": attempt, "type": type_, "worker": worker, "data": data},
        )

    def reclaim_expired(
        self,
        cur: CursorWrapper,
        row: ExpiredRow,
        *,
        terminal: bool,
        charged: bool,
        worker: str,
        error: str,
        gone_for: float | None = None,
        delay: float = 0.0,
    ) -> bool:
        """The reaper's compare-and-set: only a still-running, still-expired, same-attempt row.

        An uncharged reclaim (the handler was never confirmed running) re-checks that no
        confirmation landed since the reaper read the row, counts the attempt as released and
        keeps the job's place (its run_at), as a release does; a charged one is due `delay`
        seconds from now (a rescue's backoff; an expired lease is already late: 0).
        `gone_for` (a rescue): the attempt's worker process was seen dead that many seconds ago;
        instead of an expired lease the row must still be that worker's open attempt, claimed
        before then (`owner_exited`).
        """
        guard = f"lease_expires_at < {self.now}" if gone_for is None else self.owner_exited()
        state = JobState.FAILED if terminal else JobState.QUEUED
        cur.execute(
            "UPDATE jobs_job SET state = %(state)s, lease_expires_at = NULL, "
            f"run_at = CASE WHEN %(charged)s THEN {self.later('delay')} ELSE run_at END, "
            f"finished_at = CASE WHEN %(terminal)s THEN {self.now} ELSE NULL END, "
            "error = CASE WHEN %(terminal)s THEN %(error)s ELSE error END, "
            "attempts_released = attempts_released + CASE WHEN %(charged)s THEN 0 ELSE 1 END, "
            f"updated_at = {self.now} "
            f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}' "
            f"AND {guard} AND (%(charged)s OR NOT EXISTS ("
            "SELECT 1 FROM jobs_attempt a WHERE a.job_id = %(id)s AND a.number = %(attempt)s "
            "AND a.running_confirmed_at IS NOT NULL))",
            {
                "id": row.id,
                "attempt": row.attempt,
                "state": state.value,
                "terminal": terminal,
                "charged": charged,
                "error": error,
                "owner": row.worker,
                "ago": -(gone_for or 0.0),
                "delay": delay,
            },
        )
        if cur.rowcount != 1:
            return False
        self.end_attempt(cur, row.id, row.attempt, AttemptOutcome.EXPIRED)
        # The silence that cost the lease is the attempt's longest heartbeat gap (jobs.ops.metrics).
        cur.execute(
            f"UPDATE jobs_attempt SET heartbeat_gap_max = {self.seconds_since('heartbeat_at')} "
            "WHERE job_id = %(id)s AND number = %(attempt)s AND heartbeat_at IS NOT NULL "
            f"AND (heartbeat_gap_max IS NULL OR heartbeat_gap_max < "
            f"{self.seconds_since('heartbeat_at')})",
            {"id": row.id, "attempt": row.attempt},
        )
        evidence = expiry_evidence(row, charged, worker_exited=gone_for is not None)
        self.insert_event(cur, row.id, row.attempt, EventType.EXPIRED, worker, evidence)
        if terminal:
            data = dumps({"reason": "expired", "error": error[-500:]})
            self.insert_event(cur, row.id, row.attempt, EventType.FAILED, worker, data)
        return True

    def release(self, cur: CursorWrapper, job_id: int, attempt: int, worker: str) -> bool:
        """Hand a claimed job back unstarted: queued again, the attempt not charged.

        The job keeps its place: its priority and its original due time (run_at) are untouched,
        so it is claimed again before the jobs of its priority that became due after it.
        """
        cur.execute(
            f"UPDATE jobs_job SET state = '{QUEUED}', lease_expires_at = NULL, "
            "attempts_released = attempts_released + 1, "
            f"updated_at = {self.now} "
            f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'",
            {"id": job_id, "attempt": attempt},
        )
        if cur.rowcount != 1:
            return False
        self.end_attempt(cur, job_id, attempt, AttemptOutcome.RELEASED)
        self.insert_event(cur, job_id, attempt, EventType.RELEASED, worker, "{}")
        return True

    def confirm_running(self, cur: CursorWrapper, job_id: int, attempt: int) -> bool:
        """Record, before the handler runs, that it runs -- only while the fence still holds."""
        cur.execute(
            f"UPDATE jobs_attempt SET running_confirmed_at = {self.now} "
            "WHERE job_id = %(id)s AND number = %(attempt)s AND EXISTS (SELECT 1 FROM jobs_job j "
            f"WHERE j.id = %(id)s AND j.attempt = %(attempt)s AND j.state = '{RUNNING}')",
            {"id": job_id, "attempt": attempt},
        )
        return cur.rowcount == 1

    def poison(self, cur: CursorWrapper, job_id: int, error: str, worker: str) -> bool:
        """Fail a queued row the database refuses to claim, so it stops blocking the queue."""
        cur.execute(
            f"UPDATE jobs_job SET state = '{JobState.FAILED}', error = %(error)s, "
            f"finished_at = {self.now}, updated_at = {self.now} "
            f"WHERE id = %(id)s AND state = '{QUEUED}'",
            {"id": job_id, "error": error},
        )
        if cur.rowcount != 1:
            return False
        data = dumps({"error": error[-500:]})
        self.insert_event(cur, job_id, 0, EventType.POISONED, worker, data)
        return True

    def checkpoint(
        self, cur: CursorWrapper, job_id: int, attempt: int, progress: Any, lease: float
    ) -> bool:
        cur.execute(
            f"UPDATE jobs_job SET progress = %(progress)s, heartbeat_at = {self.now}, "
            f"lease_expires_at = {self.later('lease')}, updated_at = {self.now} "
            f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'",
            {"id": job_id, "attempt": attempt, "progress": dumps(progress), "lease": lease},
        )
        return cur.rowcount == 1

    # -- hot path: vendor specific -----------------------------------------------------------------

    def claim(
        self,
        cur: CursorWrapper,
        worker: str,
        limit: int,
        lease: float,
        queues: Sequence[str] | None,
        kind_leases: Mapping[str, float],
        only_id: int | None = None,
        locked: Sequence[str] = (),
    ) -> list[ClaimedRow]:
        """Take up to `limit` due jobs (or only `only_id`, if it is due), in claim order.

        `locked`: the limited queues whose control rows the caller's transaction holds
        (queues.lock_limited); every other limited queue is left alone by this claim."""
        raise NotImplementedError

    def heartbeat(
        self, cur: CursorWrapper, fences: Sequence[FenceRow], confirm: int | None
    ) -> set[int]:
        """Extend every lease still owned; return the ids whose fence still held.

        `confirm` is the job whose handler is running now: its attempt is marked confirmed.
        """
        raise NotImplementedError

    def commit(self, cur: CursorWrapper, worker: str, rows: Sequence[CommitRow]) -> set[int]:
        """Mark every row whose fence still holds succeeded; return the ids that committed."""
        raise NotImplementedError

    def fail(
        self,
        cur: CursorWrapper,
        job_id: int,
        attempt: int,
        worker: str,
        error: str,
        retry_in: float | None,
    ) -> bool:
        raise NotImplementedError
