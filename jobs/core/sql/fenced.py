"""The token-checked write's second check, made by its transaction's COMMIT (PostgreSQL).

Owns: the SQL that marks a write as ctx.fenced_write()'s, fenced_create()'s or
fenced_delete()'s (`MARK`, a transaction-local setting; `DELETER`, who deletes), the constraint
triggers each FencedRow table carries (`install_trigger`), and the names that say a COMMIT was
refused (`CONSTRAINT`). The trigger's function, `jobs_fence_at_commit()`, is migration 0023's,
extended to INSERT and DELETE by 0025. Never: decides (jobs/effects/fenced.py and
fenced_rows.py write, fenced.py installs), never on SQLite -- one writer there: nobody can take
a job over while the handler's transaction is open.

Why: the UPDATE decides against the job's attempt when it runs. Inside the handler's own
transaction its rows become visible only at that transaction's COMMIT; a worker stalled in
between (a pause, a partition) could have its job taken over and still commit. So every row the
write changed also queues a deferred check that the COMMIT runs: the job row, locked FOR SHARE,
must still be at the writer's attempt and running, else the COMMIT fails (`check_violation`,
constraint `jobs_fence_at_commit`) and the whole transaction is rolled back. The share lock,
held from that check to the end of the COMMIT, is what makes the check and the commit one: a
claim, a reap or an operator's cancel of that job waits those microseconds, and a takeover that
committed first is seen (READ COMMITTED reads the newest version of a row it locks). Under
REPEATABLE READ or SERIALIZABLE, locking a row changed after the snapshot (a heartbeat changes the
job row) is a serialization failure: the COMMIT fails then even for the owner -- safe, not live;
docs/effects.md says so.

Only the rows the fenced calls' own statements change are checked: each turns the
transaction-local setting on just before its statement and off just after, and a trigger's WHEN
reads it at the statement (a constraint trigger's WHEN is evaluated then, not at the COMMIT); the
function compares the row's new token with the job row at the COMMIT. A plain `save()` of such a
row is never checked. The WHEN names no column of the table, so the application's migrations
may still change the fence columns' types.

Three triggers per table (`TRIGGERS`), one per statement: UPDATE and INSERT fire on `MARK`
('on'), DELETE on `MARK_DELETE` ('delete') only. So what a fenced_delete cascades to other
FencedRow tables (Django's SET_NULL, a signal's save) is not taken for a fenced write of those
rows -- their tokens are other writers', or none, and the COMMIT refused the owner's delete --
while the rows it cascades to delete are checked as its own. The UPDATE trigger is 0023's, byte
for byte (same digest): `migrate` adds the other two beside it, with no DROP, so neither the
application's readers (a DROP's ACCESS EXCLUSIVE lock) nor an older worker still running
(whose check looks for this trigger by name) notice the upgrade.
"""

import hashlib

SETTING = "palisade.fenced_write"
MARK = f"SELECT set_config('{SETTING}', 'on', true)"  # just before an UPDATE or INSERT
MARK_DELETE = f"SELECT set_config('{SETTING}', 'delete', true)"  # just before a DELETE
UNMARK = f"SELECT set_config('{SETTING}', '', true)"  # just after it
DELETERS = "palisade.fenced_deleters"
# Before a fenced DELETE: this fence joins the transaction's deleters ("<job>:<attempt> ..."),
# once (the COMMIT checks each deleter for each deleted row: a list grown by every call of a loop
# would make that COMMIT quadratic).
DELETER = (
    f"SELECT set_config('{DELETERS}', CASE WHEN %(fence)s::text = ANY(string_to_array("
    f"coalesce(current_setting('{DELETERS}', true), ''), ' ')) THEN current_setting('{DELETERS}') "
    f"ELSE concat_ws(' ', nullif(current_setting('{DELETERS}', true), ''), %(fence)s::text) END, "
    "true)"
)
CONSTRAINT = "jobs_fence_at_commit"
FUNCTION = "jobs_fence_at_commit"
TRIGGER = "jobs_fence_at_commit"  # the UPDATE's (0023's name)
TRIGGER_INSERT = "jobs_fence_at_commit_insert"
TRIGGER_DELETE = "jobs_fence_at_commit_delete"
# Each trigger: the statement it follows and the setting's value that queues its check.
TRIGGERS = {
    TRIGGER: ("UPDATE", "on"),
    TRIGGER_INSERT: ("INSERT", "on"),
    TRIGGER_DELETE: ("DELETE", "delete"),
}
# The columns the function reads (jobs.models.FencedRow's fields).
COLUMNS = ("fence_job_id", "fence_attempt")

FUNCTION_EXISTS = f"SELECT to_regproc('{FUNCTION}') IS NOT NULL"
# An installed trigger's comment (the digest of the SQL that created it) and whether it is
# enabled. `migrate` (re)creates a trigger only when it is missing, disabled or differs: DROP
# TRIGGER takes an ACCESS EXCLUSIVE lock on the application's table, which a deploy's migrate must
# not take for nothing (CREATE TRIGGER alone takes a lock that lets reads go on).
TRIGGER_STATE = (
    "SELECT obj_description(oid, 'pg_trigger'), tgenabled <> 'D' FROM pg_trigger "
    "WHERE tgrelid = %s::regclass AND tgname = %s"
)


def install_trigger(table: str, label: str, replace: bool, name: str = TRIGGER) -> tuple[str, str]:
    """The SQL that creates the deferred check `name` (one of `TRIGGERS`) on `table` (quoted;
    `label` names it in refusals) -- dropping the one there first with `replace` -- and the
    digest its comment carries."""
    event, value = TRIGGERS[name]
    literal = "'" + label.replace("'", "''") + "'"
    create = (
        f"CREATE CONSTRAINT TRIGGER {name} AFTER {event} ON {table} "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        f"WHEN (current_setting('{SETTING}', true) = '{value}') "
        f"EXECUTE FUNCTION {FUNCTION}({literal})"
    )
    digest = "palisade " + hashlib.sha256(create.encode()).hexdigest()[:16]
    drop = f"DROP TRIGGER IF EXISTS {name} ON {table}; " if replace else ""
    return f"{drop}{create}; COMMENT ON TRIGGER {name} ON {table} IS '{digest}'", digest
