"""Every SQL statement of the job platform, behind one driver per database vendor.

Owns: SQL text. Never: decides anything or opens transactions -- jobs/transitions.py calls these
inside its own transaction and interprets the row counts.

Hazards, and why the statements look the way they do:
- Every write after a claim is one conditional statement `WHERE id = ? AND attempt = ? AND
  state = ?`; under READ COMMITTED PostgreSQL re-evaluates that WHERE against the newest row
  version after waiting on a concurrent writer, so exactly one of two racing writers wins.
- Time is the database's: `clock_timestamp()` (not `now()`, which is frozen at BEGIN). Workers
  never compare leases with their own clock.
- On PostgreSQL the hot-path transitions are single statements (data-modifying CTEs) so a claim,
  heartbeat or commit costs one round trip including its Attempt and event rows. SQLite (the
  embedded single-machine default) has no data-modifying CTEs or SKIP LOCKED; its IMMEDIATE
  transactions serialise writers instead, and its driver issues the same writes one by one.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.backends.utils import CursorWrapper

from jobs.states import AttemptOutcome, EventType, JobState

RUNNING = JobState.RUNNING.value
QUEUED = JobState.QUEUED.value

_JOB_COLUMNS = "id, attempt, kind, payload, max_attempts, lease_seconds"


@dataclass(frozen=True)
class ClaimedRow:
    id: int
    attempt: int
    kind: str
    payload: Any
    max_attempts: int | None
    lease_seconds: float | None


@dataclass(frozen=True)
class CommitRow:
    """One attempt's commit: the job is succeeded only if (id, attempt) is still current."""

    id: int
    attempt: int
    result: Any
    ref: str


@dataclass(frozen=True)
class FenceRow:
    """(job id, attempt) plus the lease to extend it by, for batch heartbeats."""

    id: int
    attempt: int
    lease_seconds: float


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _queue_filter(queues: Sequence[str] | None, params: dict[str, Any]) -> str:
    if not queues:
        return ""
    names = []
    for i, q in enumerate(queues):
        params[f"q{i}"] = q
        names.append(f"%(q{i})s")
    return f" AND queue IN ({', '.join(names)})"


class Driver:
    """Statements shared by both vendors; vendor drivers fill in the clock and the hot path."""

    now = ""  # SQL expression of the database clock
    # True when claim, heartbeat, checkpoint, commit and fail are each one statement.
    single_statement_writes = False

    def later(self, seconds_param: str) -> str:
        raise NotImplementedError

    # -- reads --------------------------------------------------------------------------------

    def count_due(self, cur: CursorWrapper, limit: int, queues: Sequence[str] | None) -> int:
        params: dict[str, Any] = {"limit": limit}
        cur.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM jobs_job WHERE state = '{QUEUED}' "
            f"AND run_at <= {self.now}{_queue_filter(queues, params)} LIMIT %(limit)s) due",
            params,
        )
        return int(cur.fetchone()[0])

    def find_expired(
        self, cur: CursorWrapper, limit: int
    ) -> list[tuple[int, int, str, int | None]]:
        cur.execute(
            f"SELECT id, attempt, kind, max_attempts FROM jobs_job "
            f"WHERE state = '{RUNNING}' AND lease_expires_at < {self.now} "
            f"ORDER BY lease_expires_at LIMIT %(limit)s",
            {"limit": limit},
        )
        return [tuple(r) for r in cur.fetchall()]  # type: ignore[misc]

    def read_job(self, cur: CursorWrapper, job_id: int) -> tuple[str, int, str] | None:
        cur.execute(
            "SELECT state, attempt, result_ref FROM jobs_job WHERE id = %(id)s", {"id": job_id}
        )
        row = cur.fetchone()
        return (row[0], int(row[1]), row[2]) if row else None

    # -- writes that are not on the hot path: same SQL on both vendors ----------------------------

    def record_rejection(
        self, cur: CursorWrapper, job_id: int, attempt: int, worker: str, write: str
    ) -> tuple[int, str] | None:
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
            "FROM jobs_job WHERE id = %(id)s RETURNING attempt_current, state_current",
            params,
        )
        row = cur.fetchone()
        if row is None:
            return None
        data = _json({"write": write, "attempt_current": row[0], "state_current": row[1]})
        self.insert_event(cur, job_id, attempt, EventType.REJECTED, worker, data)
        return int(row[0]), row[1]

    def end_attempt(self, cur: CursorWrapper, job_id: int, attempt: int, outcome: str) -> None:
        """Close an attempt row that a zombie still thinks is open (never a settled one)."""
        cur.execute(
            "UPDATE jobs_attempt SET outcome = %(outcome)s, "
            f"ended_at = COALESCE(ended_at, {self.now}) "
            f"WHERE job_id = %(id)s AND number = %(attempt)s "
            f"AND outcome IN ('{AttemptOutcome.RUNNING}', '{AttemptOutcome.EXPIRED}')",
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
        self, cur: CursorWrapper, job_id: int, attempt: int, terminal: bool, worker: str
    ) -> bool:
        """The reaper's compare-and-set: only a still-running, still-expired, same-attempt row."""
        state = JobState.FAILED if terminal else JobState.QUEUED
        cur.execute(
            f"UPDATE jobs_job SET state = %(state)s, lease_expires_at = NULL, run_at = {self.now}, "
            f"finished_at = CASE WHEN %(terminal)s THEN {self.now} ELSE NULL END, "
            "error = CASE WHEN %(terminal)s THEN %(error)s ELSE error END, "
            f"updated_at = {self.now} "
            f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}' "
            f"AND lease_expires_at < {self.now}",
            {
                "id": job_id,
                "attempt": attempt,
                "state": state.value,
                "terminal": terminal,
                "error": f"lease of attempt {attempt} expired on the last attempt",
            },
        )
        if cur.rowcount != 1:
            return False
        self.end_attempt(cur, job_id, attempt, AttemptOutcome.EXPIRED)
        self.insert_event(cur, job_id, attempt, EventType.EXPIRED, worker, _json({}))
        if terminal:
            self.insert_event(
                cur, job_id, attempt, EventType.FAILED, worker, _json({"reason": "expired"})
            )
        return True

    def checkpoint(
        self, cur: CursorWrapper, job_id: int, attempt: int, progress: Any, lease: float
    ) -> bool:
        cur.execute(
            f"UPDATE jobs_job SET progress = %(progress)s, heartbeat_at = {self.now}, "
            f"lease_expires_at = {self.later('lease')}, updated_at = {self.now} "
            f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'",
            {"id": job_id, "attempt": attempt, "progress": _json(progress), "lease": lease},
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
    ) -> list[ClaimedRow]:
        raise NotImplementedError

    def heartbeat(self, cur: CursorWrapper, fences: Sequence[FenceRow]) -> set[int]:
        """Extend every lease still owned; return the ids whose fence still held."""
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


def _claimed(rows: Sequence[Sequence[Any]]) -> list[ClaimedRow]:
    return [ClaimedRow(int(r[0]), int(r[1]), r[2], _loads(r[3]), r[4], r[5]) for r in rows]


class PostgresDriver(Driver):
    now = "clock_timestamp()"
    single_statement_writes = True

    def later(self, seconds_param: str) -> str:
        return f"clock_timestamp() + make_interval(secs => %({seconds_param})s)"

    def claim(self, cur, worker, limit, lease, queues):  # type: ignore[no-untyped-def]
        params: dict[str, Any] = {"worker": worker, "limit": limit, "lease": lease}
        queue_filter = _queue_filter(queues, params)
        # The inner SELECT walks jobs_job_pick_idx in claim order and skips rows another claimer
        # holds; the UPDATE bumps the fencing token; Attempt and event rows ride in the same
        # statement, so a claim is one round trip however many rows it takes.
        cur.execute(
            f"""
            WITH picked AS (
                SELECT id FROM jobs_job
                 WHERE state = '{QUEUED}' AND run_at <= clock_timestamp(){queue_filter}
                 ORDER BY priority DESC, run_at, id
                 LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED
            ), claimed AS (
                UPDATE jobs_job j
                   SET state = '{RUNNING}', attempt = j.attempt + 1,
                       lease_expires_at = clock_timestamp()
                           + make_interval(secs => COALESCE(j.lease_seconds, %(lease)s)),
                       heartbeat_at = clock_timestamp(), updated_at = clock_timestamp()
                  FROM picked WHERE j.id = picked.id
                RETURNING j.{_JOB_COLUMNS.replace(", ", ", j.")}
            ), attempts AS (
                INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, heartbeat_at,
                                          outcome, staging_ref, error)
                SELECT id, attempt, %(worker)s, clock_timestamp(), clock_timestamp(),
                       '{AttemptOutcome.RUNNING}', '', ''
                  FROM claimed
            ), events AS (
                INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
                SELECT id, attempt, '{EventType.CLAIMED}', %(worker)s, clock_timestamp(), '{{}}'
                  FROM claimed
            )
            SELECT {_JOB_COLUMNS} FROM claimed ORDER BY id
            """,
            params,
        )
        return _claimed(cur.fetchall())

    def heartbeat(self, cur, fences):  # type: ignore[no-untyped-def]
        params: dict[str, Any] = {}
        values = []
        for i, f in enumerate(fences):
            params.update({f"i{i}": f.id, f"a{i}": f.attempt, f"l{i}": float(f.lease_seconds)})
            values.append(f"(%(i{i})s::bigint, %(a{i})s::int, %(l{i})s::float8)")
        cur.execute(
            f"""
            WITH beat AS (
                UPDATE jobs_job j
                   SET lease_expires_at = clock_timestamp() + make_interval(secs => v.lease),
                       heartbeat_at = clock_timestamp()
                  FROM (VALUES {", ".join(values)}) AS v(id, attempt, lease)
                 WHERE j.id = v.id AND j.attempt = v.attempt AND j.state = '{RUNNING}'
                RETURNING j.id, j.attempt
            ), attempts AS (
                UPDATE jobs_attempt a SET heartbeat_at = clock_timestamp()
                  FROM beat WHERE a.job_id = beat.id AND a.number = beat.attempt
            )
            SELECT id FROM beat
            """,
            params,
        )
        return {int(r[0]) for r in cur.fetchall()}

    def commit(self, cur, worker, rows):  # type: ignore[no-untyped-def]
        # Several attempts' commits in one statement (one WAL flush), each row still fenced by
        # its own (id, attempt): a stale row simply does not match and is reported missing.
        params: dict[str, Any] = {"worker": worker}
        values = []
        for i, r in enumerate(rows):
            params.update(
                {f"i{i}": r.id, f"a{i}": r.attempt, f"r{i}": _json(r.result), f"f{i}": r.ref}
            )
            values.append(f"(%(i{i})s::bigint, %(a{i})s::int, %(r{i})s::jsonb, %(f{i})s::text)")
        cur.execute(
            f"""
            WITH done AS (
                UPDATE jobs_job j
                   SET state = '{JobState.SUCCEEDED}', result = v.result, result_ref = v.ref,
                       error = '', lease_expires_at = NULL,
                       finished_at = clock_timestamp(), updated_at = clock_timestamp()
                  FROM (VALUES {", ".join(values)}) AS v(id, attempt, result, ref)
                 WHERE j.id = v.id AND j.attempt = v.attempt AND j.state = '{RUNNING}'
                RETURNING j.id, j.attempt, v.ref
            ), attempts AS (
                UPDATE jobs_attempt a SET outcome = '{AttemptOutcome.SUCCEEDED}',
                       ended_at = clock_timestamp(), staging_ref = done.ref
                  FROM done WHERE a.job_id = done.id AND a.number = done.attempt
            ), events AS (
                INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
                SELECT id, attempt, '{EventType.SUCCEEDED}', %(worker)s, clock_timestamp(), '{{}}'
                  FROM done
            )
            SELECT id FROM done
            """,
            params,
        )
        return {int(r[0]) for r in cur.fetchall()}

    def fail(self, cur, job_id, attempt, worker, error, retry_in):  # type: ignore[no-untyped-def]
        retry = retry_in is not None
        cur.execute(
            f"""
            WITH failed AS (
                UPDATE jobs_job
                   SET state = %(state)s, error = %(error)s, lease_expires_at = NULL,
                       run_at = CASE WHEN %(retry)s
                                THEN clock_timestamp() + make_interval(secs => %(delay)s)
                                ELSE run_at END,
                       finished_at = CASE WHEN %(retry)s THEN NULL ELSE clock_timestamp() END,
                       updated_at = clock_timestamp()
                 WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'
                RETURNING id, attempt
            ), attempts AS (
                UPDATE jobs_attempt a SET outcome = '{AttemptOutcome.FAILED}',
                       ended_at = clock_timestamp(), error = %(error)s
                  FROM failed WHERE a.job_id = failed.id AND a.number = failed.attempt
            ), events AS (
                INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
                SELECT id, attempt, %(event)s, %(worker)s, clock_timestamp(), %(data)s::jsonb
                  FROM failed
            )
            SELECT count(*) FROM failed
            """,
            {
                "id": job_id,
                "attempt": attempt,
                "worker": worker,
                "error": error,
                "retry": retry,
                "delay": float(retry_in or 0.0),
                "state": (JobState.QUEUED if retry else JobState.FAILED).value,
                "event": (EventType.RETRY_SCHEDULED if retry else EventType.FAILED).value,
                "data": _json({"retry_in": retry_in, "error": error[-500:]}),
            },
        )
        return int(cur.fetchone()[0]) == 1


class SqliteDriver(Driver):
    # Django stores SQLite datetimes as UTC text 'YYYY-MM-DD HH:MM:SS.ffffff', which sorts and
    # compares correctly against this expression.
    now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"

    def later(self, seconds_param: str) -> str:
        return (
            f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %({seconds_param})s || ' seconds')"
        )

    def claim(self, cur, worker, limit, lease, queues):  # type: ignore[no-untyped-def]
        params: dict[str, Any] = {"limit": limit, "lease": lease}
        cur.execute(
            f"UPDATE jobs_job SET state = '{RUNNING}', attempt = attempt + 1, "
            f"lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', "
            f"'+' || COALESCE(lease_seconds, %(lease)s) || ' seconds'), "
            f"heartbeat_at = {self.now}, updated_at = {self.now} "
            f"WHERE state = '{QUEUED}' AND id IN (SELECT id FROM jobs_job WHERE state = '{QUEUED}' "
            f"AND run_at <= {self.now}{_queue_filter(queues, params)} "
            f"ORDER BY priority DESC, run_at, id LIMIT %(limit)s) RETURNING {_JOB_COLUMNS}",
            params,
        )
        rows = sorted(_claimed(cur.fetchall()), key=lambda r: r.id)
        for row in rows:
            cur.execute(
                "INSERT INTO jobs_attempt "
                "(job_id, number, worker, claimed_at, heartbeat_at, outcome, staging_ref, error) "
                f"VALUES (%(id)s, %(attempt)s, %(worker)s, {self.now}, {self.now}, "
                f"'{AttemptOutcome.RUNNING}', '', '')",
                {"id": row.id, "attempt": row.attempt, "worker": worker},
            )
            self.insert_event(cur, row.id, row.attempt, EventType.CLAIMED, worker, "{}")
        return rows

    def heartbeat(self, cur, fences):  # type: ignore[no-untyped-def]
        held = set()
        for f in fences:
            cur.execute(
                f"UPDATE jobs_job SET lease_expires_at = {self.later('lease')}, "
                f"heartbeat_at = {self.now} "
                f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'",
                {"id": f.id, "attempt": f.attempt, "lease": float(f.lease_seconds)},
            )
            if cur.rowcount == 1:
                held.add(f.id)
                cur.execute(
                    f"UPDATE jobs_attempt SET heartbeat_at = {self.now} "
                    "WHERE job_id = %(id)s AND number = %(attempt)s",
                    {"id": f.id, "attempt": f.attempt},
                )
        return held

    def commit(self, cur, worker, rows):  # type: ignore[no-untyped-def]
        committed = set()
        for r in rows:
            cur.execute(
                f"UPDATE jobs_job SET state = '{JobState.SUCCEEDED}', result = %(result)s, "
                f"result_ref = %(ref)s, error = '', lease_expires_at = NULL, "
                f"finished_at = {self.now}, updated_at = {self.now} "
                f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'",
                {"id": r.id, "attempt": r.attempt, "result": _json(r.result), "ref": r.ref},
            )
            if cur.rowcount != 1:
                continue
            committed.add(r.id)
            cur.execute(
                f"UPDATE jobs_attempt SET outcome = '{AttemptOutcome.SUCCEEDED}', "
                f"ended_at = {self.now}, staging_ref = %(ref)s "
                "WHERE job_id = %(id)s AND number = %(attempt)s",
                {"id": r.id, "attempt": r.attempt, "ref": r.ref},
            )
            self.insert_event(cur, r.id, r.attempt, EventType.SUCCEEDED, worker, "{}")
        return committed

    def fail(self, cur, job_id, attempt, worker, error, retry_in):  # type: ignore[no-untyped-def]
        retry = retry_in is not None
        cur.execute(
            f"UPDATE jobs_job SET state = %(state)s, error = %(error)s, lease_expires_at = NULL, "
            f"run_at = CASE WHEN %(retry)s THEN {self.later('delay')} ELSE run_at END, "
            f"finished_at = CASE WHEN %(retry)s THEN NULL ELSE {self.now} END, "
            f"updated_at = {self.now} "
            f"WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'",
            {
                "id": job_id,
                "attempt": attempt,
                "error": error,
                "retry": retry,
                "delay": float(retry_in or 0.0),
                "state": (JobState.QUEUED if retry else JobState.FAILED).value,
            },
        )
        if cur.rowcount != 1:
            return False
        cur.execute(
            f"UPDATE jobs_attempt SET outcome = '{AttemptOutcome.FAILED}', ended_at = {self.now}, "
            "error = %(error)s WHERE job_id = %(id)s AND number = %(attempt)s",
            {"id": job_id, "attempt": attempt, "error": error},
        )
        event = EventType.RETRY_SCHEDULED if retry else EventType.FAILED
        data = _json({"retry_in": retry_in, "error": error[-500:]})
        self.insert_event(cur, job_id, attempt, event, worker, data)
        return True


_DRIVERS: dict[str, Driver] = {"postgresql": PostgresDriver(), "sqlite": SqliteDriver()}


def driver_for(vendor: str) -> Driver:
    try:
        return _DRIVERS[vendor]
    except KeyError:
        raise RuntimeError(f"Palisade supports PostgreSQL and SQLite, not {vendor!r}") from None
