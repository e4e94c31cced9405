"""The defer trigger runs only when it could change something (issue 20, the single enqueue).

jobs_job_defer (migration 0010) ran its PL/pgSQL function for every queued row inserted or
requeued, to set `deferred` from `run_at`; for a job due now -- almost every enqueue -- the
function set it to the false it already was. Its WHEN clause now also asks
`NEW.deferred OR NEW.run_at > clock_timestamp() + horizon`: when that is false the function would
have written false over false, so the row ends exactly as before, without a PL/pgSQL call (about
a tenth of the one-statement enqueue's server time, measured with pgbench on the enqueue's own
statement). A deferred row coming within the horizon (NEW.deferred) and a row due beyond it still
run the function. PostgreSQL only, like 0010.
"""

import importlib

from django.db import migrations

# The same horizon as the function's (kept in step with jobs.core.sql.postgres by a test).
HORIZON = importlib.import_module("jobs.migrations.0010_queue_controls").DEFER_HORIZON

FORWARDS = f"""
DROP TRIGGER IF EXISTS jobs_job_defer ON jobs_job;
CREATE TRIGGER jobs_job_defer
    BEFORE INSERT OR UPDATE OF state, run_at ON jobs_job
    FOR EACH ROW WHEN (NEW.state = 'queued'
                       AND (NEW.deferred OR NEW.run_at > clock_timestamp() + interval '{HORIZON}'))
    EXECUTE FUNCTION jobs_job_defer();
"""

BACKWARDS = """
DROP TRIGGER IF EXISTS jobs_job_defer ON jobs_job;
CREATE TRIGGER jobs_job_defer
    BEFORE INSERT OR UPDATE OF state, run_at ON jobs_job
    FOR EACH ROW WHEN (NEW.state = 'queued') EXECUTE FUNCTION jobs_job_defer();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARDS)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARDS)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0016_drain")]

    operations = [migrations.RunPython(forwards, backwards)]
