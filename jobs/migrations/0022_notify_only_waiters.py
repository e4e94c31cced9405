"""An enqueue NOTIFYs only while some process waits for it (jobs/core/sql/queues.py, WAITER).

A transaction that sent a NOTIFY takes, at its commit, a lock on the whole database's notification
queue and holds it until the commit is flushed and done: notifying commits run one at a time. With
a NOTIFY on every enqueue, eight concurrent enqueuers committed 4,258 a second here and 9,524
without it; one enqueuer 2,840 and 3,488 (pgbench sending the enqueue's statement;
docs/benchmarks.md). A NOTIFY is only of use to a process blocked on LISTEN -- an idle drain, or
a scheduler with nothing due. So the triggers now send theirs only when such a process holds the
WAITER advisory lock (shared, for as long as it waits), decided in the trigger's WHEN clause with
no function call when nobody waits:

- FENCE, shared and until the enqueuing transaction ends, is taken first. A process that begins to
  wait takes WAITER and then must take FENCE exclusively once (jobs/worker/listener.py) before it
  blocks: every enqueue that looked before it came is committed or gone by then, and it claims
  once more. If FENCE cannot be taken (a waiter is checking it at that instant) the enqueue
  notifies -- a NOTIFY too many is always safe.
- The WAITER check is a try of the exclusive lock, given back in the same expression; it fails
  while any waiter holds the shared one (or another enqueue checks in the same microseconds: then
  this one notifies, harmlessly).

The same for the requeue trigger (retries, releases, the reaper, an operator's requeue). A
queue's resume (jobs/core/sql/queues.py) still always notifies. PostgreSQL only.
"""

from django.db import migrations

CLASS, WAITER, FENCE = 0x5041_4C49, 1, 2  # jobs.core.sql.queues: WAKE_LOCK_CLASS, *_KEY
WANTED = (
    f"NOT pg_try_advisory_xact_lock_shared({CLASS}, {FENCE}) OR NOT "
    f"(pg_try_advisory_lock({CLASS}, {WAITER}) AND pg_advisory_unlock({CLASS}, {WAITER}))"
)

CREATE = f"""
DROP TRIGGER IF EXISTS jobs_job_enqueued_insert ON jobs_job;
CREATE TRIGGER jobs_job_enqueued_insert
    AFTER INSERT ON jobs_job REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT WHEN ({WANTED}) EXECUTE FUNCTION jobs_notify_enqueued_rows();
DROP TRIGGER IF EXISTS jobs_job_enqueued_requeue ON jobs_job;
CREATE TRIGGER jobs_job_enqueued_requeue
    AFTER UPDATE OF state ON jobs_job
    FOR EACH ROW WHEN (NEW.state = 'queued' AND OLD.state <> 'queued' AND ({WANTED}))
    EXECUTE FUNCTION jobs_notify_enqueued();
"""

DROP = """
DROP TRIGGER IF EXISTS jobs_job_enqueued_insert ON jobs_job;
CREATE TRIGGER jobs_job_enqueued_insert
    AFTER INSERT ON jobs_job REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_enqueued_rows();
DROP TRIGGER IF EXISTS jobs_job_enqueued_requeue ON jobs_job;
CREATE TRIGGER jobs_job_enqueued_requeue
    AFTER UPDATE OF state ON jobs_job
    FOR EACH ROW WHEN (NEW.state = 'queued' AND OLD.state <> 'queued')
    EXECUTE FUNCTION jobs_notify_enqueued();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0021_count_due_in_claim_order"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
