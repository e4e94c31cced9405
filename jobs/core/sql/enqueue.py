"""PostgreSQL's one-statement enqueue: the job row and its `enqueued` event in one round trip.

Owns: the SQL text of `Job.objects.enqueue()` on PostgreSQL. Never: decides what a valid job is
(jobs/core/enqueue.py `fields`) nor which columns a job has -- the caller passes the columns it
derived from the model, so a column added later with a default needs no change here.

Hazards, and why the statement looks the way it does:
- A data-modifying CTE inserts the job and, from its RETURNING, the event; the NOTIFY trigger on
  jobs_job rides on the caller's COMMIT as before. In autocommit the statement is its own
  transaction: no BEGIN, no COMMIT, one round trip. A duplicate's INSERT inserts nothing, but a
  per-statement trigger still fires: a drain wakes and finds nothing new.
- Unique keys: `ON CONFLICT DO NOTHING` (the only unique index a new job can collide on besides
  the serial primary key is jobs_job_unique_key_live), so a key held by a live job never raises,
  and never aborts the caller's transaction -- no savepoint needed. The last SELECT returns that
  holder instead, marked `duplicate`. Both parts read the statement's snapshot: a holder
  committed after it began (a concurrent enqueue we waited on) is in neither, and the statement
  returns no row; the caller then takes its slower savepoint path, which reads with a new
  snapshot.
- Under REPEATABLE READ or SERIALIZABLE, ON CONFLICT against a committed holder the snapshot
  cannot see raises a serialization failure, which would abort the caller's transaction: there the
  insert is skipped (`transaction_isolation` gate) and, unless a visible holder is returned, the
  statement returns no row and the caller's savepoint path decides (DuplicateJob, as before).
- Placeholders and literals carry explicit casts (`cast`): INSERT ... SELECT resolves untyped
  literals to text, which has no assignment cast to jsonb.
- Values that are the same for every job (the new job's state, attempt, ..., the whole event) are
  literals in the text, rendered once by the caller: the statement is prepared once per
  connection (jobs/models/prepared.py), and each call sends only the row's own values.
- What comes back: a keyed statement returns the whole row (the holder's when it is a
  duplicate); a keyless one only what the database decided, and the caller builds the rest from
  what it sent (jobs/models/one_statement.py). Unprepared (behind a transaction pooler), the
  statement is parsed and planned on every call, and 22 columns named twice (the CTE's RETURNING,
  the last SELECT) were about half of that (docs/benchmarks.md, 2026-12-06).
"""

from collections.abc import Sequence

# A row of the statement: the returned columns, then `duplicate`.
DUPLICATE_COLUMN = "duplicate"


def enqueue_statement(
    columns: Sequence[str],
    values: Sequence[str],
    event_columns: Sequence[str],
    event_values: Sequence[str],
    returning: Sequence[str],
    live_holder: str | None,
) -> str:
    """The statement inserting one job (`columns` = `values`) and its event.

    `values` and `event_values` are SQL expressions, each cast to its column's type: a `%s`
    placeholder, or a literal the caller rendered for a value that is the same for every job (so
    the statement carries only what changes: fewer parameters to send, bind and convert).
    Parameters, in order: the job's placeholders, the event's (its `job_id` comes from the
    inserted row), then -- with `live_holder`, the SQL condition of a live job holding a key --
    the unique key once. `returning` names the job columns returned by both the inserted and the
    holder row (for a keyless job the caller may name only those the database decides).

    A keyless job's row is `VALUES (...)`, a keyed one's `SELECT ... WHERE` (the isolation gate):
    PostgreSQL parses and plans the VALUES form in less time, which is what an unprepared
    statement (behind a transaction pooler) pays on every call.
    """
    out = ", ".join(returning)
    holder_out = ", ".join(f"h.{c}" for c in returning)
    row = f"VALUES ({', '.join(values)})"  # a keyless job: nothing to gate
    conflict = holder = ""
    if live_holder is not None:
        row = f"SELECT {', '.join(values)}"
        row += " WHERE current_setting('transaction_isolation') = 'read committed'"
        conflict = " ON CONFLICT DO NOTHING"
        holder = (
            f" UNION ALL (SELECT {holder_out}, true FROM jobs_job h"
            f" WHERE h.unique_key = %s AND {live_holder}"
            " AND NOT EXISTS (SELECT 1 FROM inserted) LIMIT 1)"
        )
    return (
        f"WITH inserted AS (INSERT INTO jobs_job ({', '.join(columns)}) {row}"
        f"{conflict} RETURNING {out}), "
        f"event AS (INSERT INTO jobs_jobevent (job_id, {', '.join(event_columns)}) "
        f"SELECT id, {', '.join(event_values)} FROM inserted) "
        f"SELECT {out}, false AS {DUPLICATE_COLUMN} FROM inserted{holder}"
    )


def cast(expression: str, sql_type: str) -> str:
    """`expression` as a value of `sql_type` (INSERT ... SELECT resolves an untyped literal or
    placeholder to text, which has no assignment cast to jsonb)."""
    return f"({expression})::{sql_type}"
