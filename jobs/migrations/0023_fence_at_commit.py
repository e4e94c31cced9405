"""A token-checked write is checked again by its transaction's COMMIT (jobs/core/sql/fenced.py).

The function each FencedRow table's deferred constraint trigger runs: the job row, locked FOR
SHARE until the COMMIT ends, must still be at the writer's attempt and running; else the COMMIT
fails with `check_violation`, constraint `jobs_fence_at_commit`, and the transaction is rolled
back. The triggers themselves are installed on every FencedRow table after each `migrate`
(jobs.apps, jobs.effects.fenced.install_commit_checks): those tables are the application's.
PostgreSQL only.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION jobs_fence_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM jobs_job
     WHERE id = NEW.fence_job_id AND attempt = NEW.fence_attempt AND state = 'running'
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            MESSAGE = 'stale token-checked write to ' || TG_ARGV[0] || ': job '
                || NEW.fence_job_id || ' attempt ' || NEW.fence_attempt
                || ' no longer owns the job at COMMIT',
            ERRCODE = 'check_violation', CONSTRAINT = 'jobs_fence_at_commit',
            TABLE = TG_TABLE_NAME, DETAIL = TG_ARGV[0];
    END IF;
    RETURN NULL;
END
$$;
"""

DROP = "DROP FUNCTION IF EXISTS jobs_fence_at_commit() CASCADE;"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0022_notify_only_waiters"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
