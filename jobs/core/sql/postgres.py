"""PostgreSQL's transitions, each one statement: claim, heartbeat, commit, fail (the hot path),
release, the reaper's reclaim and poison.

Data-modifying CTEs fold the Attempt and event rows into the statement that moves the job, so
each transition is one round trip, atomic on its own, and runs in autocommit (see
jobs/core/transitions). Never: two CTEs updating the same row -- PostgreSQL applies only one.
"""

from collections.abc import Sequence
from typing import Any

from jobs.core.sql import plans
from jobs.core.sql import queues as queues_sql
from jobs.core.sql.base import (
    JOB_COLUMNS,
    OPEN,
    QUEUED,
    RUNNING,
    Driver,
    commit_arrays,
    dumps,
    expiry_evidence,
    fetch_claimed,
    lease_expression,
    queue_filter,
)
from jobs.core.sql.intents import intents_cte
from jobs.core.states import AttemptOutcome, EventType, JobState

# A queued row due further ahead than this is `deferred` (migration 0010's trigger, which keeps
# the same interval): out of the pick index until a claim promotes it, this long before it is due.
DEFER_HORIZON_SECONDS = 60

# now(), not clock_timestamp(): a volatile bound would be a filter over every deferred row, where
# a stable one is a range of jobs_job_deferred_idx (a claim runs in autocommit, so now() is its
# own start; a horizon's worth of milliseconds either way changes nothing).
PROMOTE = f"""promoted AS (
                UPDATE jobs_job SET deferred = false
                 WHERE id IN (SELECT id FROM jobs_job
                               WHERE state = '{QUEUED}' AND deferred
                                 AND run_at <= now()
                                            + make_interval(secs => {DEFER_HORIZON_SECONDS})
                               ORDER BY run_at LIMIT 1000 FOR UPDATE SKIP LOCKED)
            ),"""


def array_format(cur: Any) -> str:
    """The placeholder letter for the commit's arrays on `cur`: "b" (binary) where the cursor
    binds its parameters on the server (jobs.core.transitions.fence.hot_cursor), "s" on a
    client-side binding cursor (JOBS_PREPARED_STATEMENTS = 0), which cannot send binary.

    In binary each element travels as its length and bytes: psycopg's text array format looks
    every string over for characters to quote (four regular-expression calls a job for the
    results and refs) and PostgreSQL parses the text back. 64 jobs' four arrays, through a
    prepared statement: 223-269 us of client CPU a call in text, 95-97 in binary.
    """
    import psycopg

    return "s" if isinstance(getattr(cur, "cursor", cur), psycopg.ClientCursor) else "b"


def pick(limit: int, queues: Sequence[str] | None, only: str, params: dict[str, Any]) -> str:
    """The claim's `picked` rows (id, queue, priority, run_at): up to `limit` due queued jobs in
    claim order, locked, none of a blocked queue.

    Through jobs_pick (migration 0018_steady_pick), a function planned with sorts and bitmap
    scans off: its only plan is the ordered walk of jobs_job_pick_idx, whatever jobs_job's
    statistics say (on a table never analyzed, or analyzed while nothing was queued, the
    planner's own choice sorted every queued row to take `limit`); while some queue is blocked,
    queue by queue through jobs_job_queue_pick_idx, so no claim steps over a blocked queue's
    backlog (migration 0019_pick_around_blocked_queues). Inline, as the planner
    decides: a claim of one given job (`only`: by its primary key), and a claim from named
    queues (JOBS_QUEUES) -- there the ordered walk would step over every queued job of the other
    queues, where the planner can take the named queues' rows by jobs_job_queue_depth_idx."""
    if only or queues:
        return f"""
                SELECT id, queue, priority, run_at FROM jobs_job
                 WHERE state = '{QUEUED}' AND NOT deferred AND run_at <= clock_timestamp()
                       {queue_filter(queues, params)}{only}{queues_sql.BLOCKED}
                 ORDER BY priority DESC, run_at, id
                 LIMIT {limit}
                   FOR UPDATE SKIP LOCKED"""
    params["limit"] = limit  # a parameter of the function: the plan is the same whatever it is
    return """
                SELECT pick_id AS id, pick_queue AS queue, pick_priority AS priority,
                       pick_run_at AS run_at
                  FROM jobs_pick(%(limit)s::int, ARRAY(SELECT queue::text FROM blocked))"""


class PostgresDriver(Driver):
    now = "clock_timestamp()"
    promote = PROMOTE  # the due count promotes too (base.Driver.count_due says why)
    single_statement_writes = True
    lock_row, key_share = " FOR UPDATE", " FOR KEY SHARE"
    listen_notify = True

    def later(self, seconds_param: str) -> str:
        return f"clock_timestamp() + make_interval(secs => %({seconds_param})s)"

    def seconds_between(self, later: str, earlier: str) -> str:
        return f"EXTRACT(EPOCH FROM ({later}) - ({earlier}))::float8"

    def count_due(self, cur, limit, queues):  # type: ignore[no-untyped-def]
        """Due jobs counted in claim order (jobs_count_due, migration 0021: the pick index, never
        the finished rows); from named queues, inline (by jobs_job_queue_depth_idx)."""
        if queues:
            return super().count_due(cur, limit, queues)
        params: dict[str, Any] = {"limit": int(limit)}
        guard = queues_sql.claim_guard(None, params).rstrip().removesuffix(",")
        cur.execute(
            f"WITH {self.promote}{guard} "
            "SELECT jobs_count_due(%(limit)s, ARRAY(SELECT queue::text FROM blocked))",
            params,
        )
        return int(cur.fetchone()[0])

    def claim(self, cur, worker, limit, lease, queues, kind_leases, only_id=None, locked=()):  # type: ignore[no-untyped-def]
        # Through jobs_pick the limit is a parameter (one text whatever the batch size, planned
        # once: jobs.core.transitions.fence._plan_once); inline it is part of the text (with
        # `LIMIT $n` PostgreSQL plans for an unknown, large limit). It is an int.
        limit = int(limit)
        params: dict[str, Any] = {"worker": worker, "lease": lease}
        only = ""
        if only_id is not None:
            params["only"] = only_id
            only = " AND id = %(only)s"
        lease_sql = lease_expression(kind_leases, params, table="j.")
        # `promoted` brings rows deferred far ahead into the pick index a horizon before they
        # are due (the rows of this claim's own pick were never deferred). `picked` walks
        # jobs_job_pick_idx in claim order whatever the statistics say (`pick`), skipping rows
        # another claimer holds and queues paused or at their limit (queues.claim_guard);
        # `capped` keeps a limited queue within its room. The UPDATE bumps the fencing token;
        # Attempt and event rows ride in the same statement, so a claim is one round trip
        # however many rows it takes. The rows come back in claim order: the drain runs them
        # in that order.
        cur.execute(
            f"""
            WITH {"" if only_id is not None else PROMOTE}{queues_sql.claim_guard(locked, params)}
            picked AS ({pick(limit, queues, only, params)}), {queues_sql.CAPPED}, claimed AS (
                UPDATE jobs_job j
                   SET state = '{RUNNING}', attempt = j.attempt + 1,
                       lease_expires_at = clock_timestamp() + make_interval(secs => {lease_sql}),
                       heartbeat_at = clock_timestamp(), updated_at = clock_timestamp()
                  FROM capped WHERE j.id = capped.id
                RETURNING j.{JOB_COLUMNS.replace(", ", ", j.")}, j.priority, j.run_at
            ), attempts AS (
                INSERT INTO jobs_attempt (job_id, number, worker, claimed_at, heartbeat_at,
                                          outcome, staging_ref, error)
                SELECT id, attempt, %(worker)s, clock_timestamp(), clock_timestamp(),
                       '{OPEN}', '', ''
                  FROM claimed
            ), events AS (
                INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
                SELECT id, attempt, '{EventType.CLAIMED}', %(worker)s, clock_timestamp(), '{{}}'
                  FROM claimed
            )
            SELECT {JOB_COLUMNS} FROM claimed ORDER BY priority DESC, run_at, id{plans.tag()}
            """,
            params,
        )
        return fetch_claimed(cur)

    def heartbeat(self, cur, fences, confirm):  # type: ignore[no-untyped-def]
        # The fences travel as three arrays, not a VALUES row of three parameters per job: one
        # statement text whatever the batch (prepared once per connection, its conversion cached
        # by psycopg).
        params: dict[str, Any] = {
            "confirm": confirm,
            "ids": [f.id for f in fences],
            "attempts": [f.attempt for f in fences],
            "leases": [float(f.lease_seconds) for f in fences],
        }
        # One UPDATE of jobs_attempt sets both the beat and, for the job whose handler runs
        # now, the confirmation (two CTEs updating one row would apply only one of them).
        cur.execute(
            f"""
            WITH beat AS (
                UPDATE jobs_job j
                   SET lease_expires_at = clock_timestamp() + make_interval(secs => v.lease),
                       heartbeat_at = clock_timestamp()
                  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(leases)s::float8[])
                       AS v(id, attempt, lease)
                 WHERE j.id = v.id AND j.attempt = v.attempt AND j.state = '{RUNNING}'
                RETURNING j.id, j.attempt
            ), attempts AS (
                UPDATE jobs_attempt a SET heartbeat_at = clock_timestamp(),
                       heartbeat_gap_max = GREATEST(COALESCE(a.heartbeat_gap_max, 0),
                           EXTRACT(EPOCH FROM clock_timestamp() - a.heartbeat_at)),
                       running_confirmed_at = CASE
                           WHEN a.job_id = %(confirm)s::bigint
                           THEN COALESCE(a.running_confirmed_at, clock_timestamp())
                           ELSE a.running_confirmed_at END
                  FROM beat WHERE a.job_id = beat.id AND a.number = beat.attempt
            )
            SELECT id FROM beat{plans.tag()}
            """,
            params,
        )
        return {int(r[0]) for r in cur.fetchall()}

    def commit(self, cur, worker, rows):  # type: ignore[no-untyped-def]
        # Several attempts' commits in one statement (one WAL flush), each row still fenced by
        # its own (id, attempt): a stale row simply does not match and is reported missing. The
        # rows travel as four arrays: one statement text whatever the batch size (prepared once
        # per connection; psycopg converts a text that long on every call, and a VALUES row per
        # job made one text per batch size, each re-prepared as the prepared-statement cache
        # turned over).
        params: dict[str, Any] = {"worker": worker, **commit_arrays(rows)}
        intents = intents_cte(rows, params)
        f = array_format(cur)
        cur.execute(
            f"""
            WITH done AS (
                UPDATE jobs_job j
                   SET state = '{JobState.SUCCEEDED}', result = v.result::jsonb, result_ref = v.ref,
                       error = '', lease_expires_at = NULL,
                       finished_at = clock_timestamp(), updated_at = clock_timestamp()
                  FROM unnest(%(ids){f}::bigint[], %(attempts){f}::int[], %(results){f}::text[],
                              %(refs){f}::text[]) AS v(id, attempt, result, ref)
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
            ){intents}
            SELECT id FROM done{plans.tag()}
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
            SELECT count(*) FROM failed{plans.tag()}
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
                "data": dumps({"retry_in": retry_in, "error": error[-500:]}),
            },
        )
        return int(cur.fetchone()[0]) == 1

    # -- the other transitions run in autocommit too, so each is one statement as well ---------
    # (base.py's versions issue several; here a connection cut between them would leave the job
    # moved and its attempt row or event missing, and a claim could log attempt 2 before the
    # reclaim logged attempt 1's expiry.)

    def release(self, cur, job_id, attempt, worker):  # type: ignore[no-untyped-def]
        # The job keeps its place: priority and run_at (its original due time) are untouched.
        cur.execute(
            f"""
            WITH released AS (
                UPDATE jobs_job SET state = '{QUEUED}', lease_expires_at = NULL,
                       attempts_released = attempts_released + 1, updated_at = clock_timestamp()
                 WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'
                RETURNING id, attempt
            ), attempts AS (
                UPDATE jobs_attempt a SET outcome = '{AttemptOutcome.RELEASED}',
                       ended_at = clock_timestamp()
                  FROM released
                 WHERE a.job_id = released.id AND a.number = released.attempt
                       AND a.outcome = '{OPEN}'
            ), events AS (
                INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
                SELECT id, attempt, '{EventType.RELEASED}', %(worker)s, clock_timestamp(), '{{}}'
                  FROM released
            )
            SELECT count(*) FROM released{plans.tag()}
            """,
            {"id": job_id, "attempt": attempt, "worker": worker},
        )
        return int(cur.fetchone()[0]) == 1

    def reclaim_expired(  # type: ignore[no-untyped-def]
        self, cur, row, *, terminal, charged, worker, error, gone_for=None, delay=0.0
    ):
        since = "EXTRACT(EPOCH FROM clock_timestamp() - a.heartbeat_at)"
        guard = "lease_expires_at < clock_timestamp()" if gone_for is None else self.owner_exited()
        cur.execute(
            f"""
            WITH reclaimed AS (
                UPDATE jobs_job
                   SET state = %(state)s, lease_expires_at = NULL,
                       -- uncharged (never confirmed running): keeps its place, as a release
                       -- does; charged: due after the delay (an expiry's 0, a rescue's backoff)
                       run_at = CASE WHEN %(charged)s THEN {self.later("delay")} ELSE run_at END,
                       finished_at = CASE WHEN %(terminal)s THEN clock_timestamp() END,
                       error = CASE WHEN %(terminal)s THEN %(error)s ELSE error END,
                       attempts_released = attempts_released
                           + CASE WHEN %(charged)s THEN 0 ELSE 1 END,
                       updated_at = clock_timestamp()
                 WHERE id = %(id)s AND attempt = %(attempt)s AND state = '{RUNNING}'
                       AND {guard}
                       AND (%(charged)s OR NOT EXISTS (
                           SELECT 1 FROM jobs_attempt c WHERE c.job_id = %(id)s
                              AND c.number = %(attempt)s AND c.running_confirmed_at IS NOT NULL))
                RETURNING id, attempt
            ), attempts AS (
                -- One UPDATE of the attempt row: closed if still open (a settled outcome is
                -- kept), and the silence that cost the lease kept as its longest heartbeat gap.
                UPDATE jobs_attempt a
                   SET outcome = CASE WHEN a.outcome = '{OPEN}'
                                 THEN '{AttemptOutcome.EXPIRED}' ELSE a.outcome END,
                       ended_at = CASE WHEN a.outcome = '{OPEN}'
                                  THEN clock_timestamp() ELSE a.ended_at END,
                       heartbeat_gap_max = CASE WHEN a.heartbeat_at IS NULL
                                           THEN a.heartbeat_gap_max
                                           ELSE GREATEST(a.heartbeat_gap_max, {since}) END
                  FROM reclaimed
                 WHERE a.job_id = reclaimed.id AND a.number = reclaimed.attempt
            ), events AS (
                INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
                SELECT r.id, r.attempt, e.type, %(worker)s, clock_timestamp(), e.data
                  FROM reclaimed r
                 CROSS JOIN (VALUES (1, '{EventType.EXPIRED}', %(evidence)s::jsonb),
                                    (2, '{EventType.FAILED}', %(failure)s::jsonb))
                       AS e(ord, type, data)
                 WHERE e.ord = 1 OR %(terminal)s
                 ORDER BY e.ord
            )
            SELECT count(*) FROM reclaimed
            """,
            {
                "id": row.id,
                "attempt": row.attempt,
                "state": (JobState.FAILED if terminal else JobState.QUEUED).value,
                "terminal": terminal,
                "charged": charged,
                "error": error,
                "worker": worker,
                "owner": row.worker,
                "ago": -(gone_for or 0.0),
                "delay": delay,
                "evidence": expiry_evidence(row, charged, worker_exited=gone_for is not None),
                "failure": dumps({"reason": "expired", "error": error[-500:]}),
            },
        )
        return int(cur.fetchone()[0]) == 1

    def poison(self, cur, job_id, error, worker):  # type: ignore[no-untyped-def]
        cur.execute(
            f"""
            WITH poisoned AS (
                UPDATE jobs_job SET state = '{JobState.FAILED}', error = %(error)s,
                       finished_at = clock_timestamp(), updated_at = clock_timestamp()
                 WHERE id = %(id)s AND state = '{QUEUED}'
                RETURNING id
            ), events AS (
                INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data)
                SELECT id, 0, '{EventType.POISONED}', %(worker)s, clock_timestamp(),
                       %(data)s::jsonb
                  FROM poisoned
            )
            SELECT count(*) FROM poisoned
            """,
            {
                "id": job_id,
                "error": error,
                "worker": worker,
                "data": dumps({"error": error[-500:]}),
            },
        )
        return int(cur.fetchone()[0]) == 1
