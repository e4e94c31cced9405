"""Wake the embedded scheduler on every committed enqueue, however the row was inserted.

PostgreSQL only: NOTIFY is delivered when the inserting transaction commits, so a job enqueued
inside an application transaction wakes a drain only once it is visible. On SQLite the scheduler
polls instead.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION jobs_notify_enqueued() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('jobs_enqueued', '');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobs_job_enqueued_insert
    AFTER INSERT ON jobs_job
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_enqueued();

-- Requeues (operator, reaper, immediate retries) wake drains too; heartbeats and claims do not.
CREATE TRIGGER jobs_job_enqueued_requeue
    AFTER UPDATE OF state ON jobs_job
    FOR EACH ROW WHEN (NEW.state = 'queued' AND OLD.state <> 'queued')
    EXECUTE FUNCTION jobs_notify_enqueued();
"""

DROP = """
DROP TRIGGER IF EXISTS jobs_job_enqueued_requeue ON jobs_job;
DROP TRIGGER IF EXISTS jobs_job_enqueued_insert ON jobs_job;
DROP FUNCTION IF EXISTS jobs_notify_enqueued();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
