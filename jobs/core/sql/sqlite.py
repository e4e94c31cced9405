"""SQLite's hot path: the same transitions as several statements in one IMMEDIATE transaction.

SQLite (the embedded single-machine default) has no data-modifying CTEs and no SKIP LOCKED; its
IMMEDIATE transactions serialise writers instead, so each write below is decided under the one
write lock. The database clock is the host's clock (one host).
"""

from typing import Any

from jobs.core.sql import queues as queues_sql
from jobs.core.sql.base import (
    JOB_COLUMNS,
    QUEUED,
    RUNNING,
    Driver,
    claimed_rows,
    dumps,
    lease_expression,
    queue_filter,
)
from jobs.core.states import AttemptOutcome, EventType, JobState


def _after_now(seconds_sql: str) -> str:
    # Arithmetic on the Julian day number, not a '+N seconds' modifier built from the number's
    # text: '+-1.0 seconds' is not a modifier, so a negative number of seconds gave NULL (a
    # lease already past, as tests plant, could not be written at all).
    return f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', julianday('now') + ({seconds_sql}) / 86400.0)"


class SqliteDriver(Driver):
    # Django stores SQLite datetimes as UTC text 'YYYY-MM-DD HH:MM:SS.ffffff', which sorts and
    # compares correctly against this expression (milliseconds: SQLite's clock resolution).
    now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    pickable = "deferred = 0"  # as jobs_job_pick_idx spells it here (always true on SQLite)

    def later(self, seconds_param: str) -> str:
        return _after_now(f"%({seconds_param})s")

    def seconds_between(self, later: str, earlier: str) -> str:
        return f"((julianday({later}) - julianday({earlier})) * 86400.0)"

    def claim(self, cur, worker, limit, lease, queues, kind_leases, only_id=None, locked=()):  # type: ignore[no-untyped-def]
        params: dict[str, Any] = {"limit": limit, "lease": lease}
        only = ""
        if only_id is not None:
            params["only"] = only_id
            only = " AND id = %(only)s"
        # The same pick as PostgreSQL's (claim order, paused and full queues left out, a limited
        # queue cut to its room), decided under the one write lock of the IMMEDIATE transaction.
        cur.execute(
            f"WITH {queues_sql.claim_guard(locked, params)} picked AS ("
            f"SELECT id, queue, priority, run_at FROM jobs_job WHERE state = '{QUEUED}' "
            f"AND {self.pickable} AND run_at <= {self.now}{queue_filter(queues, params)}{only}"
            f"{queues_sql.BLOCKED} ORDER BY priority DESC, run_at, id LIMIT %(limit)s), "
            f"{queues_sql.CAPPED} "
            f"UPDATE jobs_job SET state = '{RUNNING}', attempt = attempt + 1, "
            f"lease_expires_at = {_after_now(lease_expression(kind_leases, params))}, "
            f"heartbeat_at = {self.now}, updated_at = {self.now} "
            f"WHERE state = '{QUEUED}' AND id IN (SELECT id FROM capped) "
            f"RETURNING {JOB_COLUMNS}, priority, run_at",
            params,
        )
        # RETURNING's order is SQLite's; the drain runs them in claim order.
        ordered = sorted(cur.fetchall(), key=lambda r: (-r[-2], r[-1], r[0]))
        rows = claimed_rows([r[:-2] for r in ordered])
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

    def heartbeat(self, cur, fences, confirm):  # type: ignore[no-untyped-def]
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
                    "UPDATE jobs_attempt SET heartbeat_gap_max = MAX("
                    "COALESCE(heartbeat_gap_max, 0), "
                    "(julianday('now') - julianday(heartbeat_at)) * 86400.0), "
                    f"heartbeat_at = {self.now}, running_confirmed_at = "
                    f"CASE WHEN %(confirm)s THEN COALESCE(running_confirmed_at, {self.now}) "
                    "ELSE running_confirmed_at END "
                    "WHERE job_id = %(id)s AND number = %(attempt)s",
                    {"id": f.id, "attempt": f.attempt, "confirm": f.id == confirm},
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
                {"id": r.id, "attempt": r.attempt, "result": dumps(r.result), "ref": r.ref},
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
            for intent in r.intents:  # only for a row that committed: a zombie's never exist
                cur.execute(
                    "INSERT INTO jobs_intent (job_id, attempt, step, key, target, lane, data) "
                    "VALUES (%(id)s, %(attempt)s, %(step)s, %(key)s, %(target)s, %(lane)s, "
                    "%(data)s) "
                    "ON CONFLICT (job_id, step) DO NOTHING",
                    {
                        "id": r.id,
                        "attempt": r.attempt,
                        "step": intent.step,
                        "key": intent.key,
                        "target": intent.target,
                        "lane": intent.lane,
                        "data": dumps(intent.data),
                    },
                )
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
        data = dumps({"retry_in": retry_in, "error": error[-500:]})
        self.insert_event(cur, job_id, attempt, event, worker, data)
        return True
