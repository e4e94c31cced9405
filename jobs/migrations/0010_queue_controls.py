"""Queue controls (pause, concurrency limit), per-queue wake-ups, and future work kept out of the
claim's way.

- jobs_queuecontrol: one row per queue an operator paused or limited (jobs/ops/queues.py).
- jobs_job.deferred: set by a BEFORE trigger for a queued row due more than DEFER_HORIZON ahead
  (however it was written: enqueue, bulk_create, raw SQL, a retry's backoff); the pick index holds
  only rows not deferred, and the claim statement clears the flag shortly before a row is due
  (jobs/core/sql/postgres.py), so a claim never walks rows scheduled far ahead.
- The enqueue NOTIFY now says which queue: `jobs_enqueued` with the queue as payload (clusters
  serving every queue) and `jobs_q_<md5 of the queue>` (clusters serving named queues), once per
  queue per statement (jobs/core/sql/queues.py names the channels the same way).
- jobs_job_running_queue_idx: running jobs per queue, counted by a limited queue's claim.

PostgreSQL only for the triggers; on SQLite `deferred` stays False and workers poll.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

DEFER_HORIZON = "60 seconds"  # jobs.core.sql.postgres.DEFER_HORIZON_SECONDS, kept in step by a test

CREATE = f"""
CREATE OR REPLACE FUNCTION jobs_job_defer() RETURNS trigger AS $$
BEGIN
    NEW.deferred := NEW.run_at > clock_timestamp() + interval '{DEFER_HORIZON}';
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobs_job_defer
    BEFORE INSERT OR UPDATE OF state, run_at ON jobs_job
    FOR EACH ROW WHEN (NEW.state = 'queued') EXECUTE FUNCTION jobs_job_defer();

CREATE OR REPLACE FUNCTION jobs_notify_enqueued_rows() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('jobs_enqueued', q), pg_notify('jobs_q_' || md5(q), '')
       FROM (SELECT DISTINCT queue AS q FROM inserted WHERE state = 'queued') s;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION jobs_notify_enqueued() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('jobs_enqueued', NEW.queue), pg_notify('jobs_q_' || md5(NEW.queue), '');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS jobs_job_enqueued_insert ON jobs_job;
CREATE TRIGGER jobs_job_enqueued_insert
    AFTER INSERT ON jobs_job REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_enqueued_rows();

UPDATE jobs_job SET deferred = true
 WHERE state = 'queued' AND run_at > clock_timestamp() + interval '{DEFER_HORIZON}';
"""

DROP = """
DROP TRIGGER IF EXISTS jobs_job_defer ON jobs_job;
DROP FUNCTION IF EXISTS jobs_job_defer();
DROP TRIGGER IF EXISTS jobs_job_enqueued_insert ON jobs_job;
CREATE OR REPLACE FUNCTION jobs_notify_enqueued() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('jobs_enqueued', '');
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_job_enqueued_insert
    AFTER INSERT ON jobs_job
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_enqueued();
DROP FUNCTION IF EXISTS jobs_notify_enqueued_rows();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0007_event_types_merged'),
    ]

    operations = [
        migrations.CreateModel(
            name='QueueControl',
            fields=[
                ('queue', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('paused', models.BooleanField(db_default=False, default=False)),
                ('concurrency_limit', models.IntegerField(blank=True, null=True)),
                ('changed_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('changed_by', models.CharField(blank=True, db_default='', default='', max_length=200)),
            ],
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='jobs_job_pick_idx',
        ),
        migrations.AddField(
            model_name='job',
            name='deferred',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(models.OrderBy(models.F('priority'), descending=True), models.F('run_at'), models.F('id'), condition=models.Q(('deferred', False), ('state', 'queued')), name='jobs_job_pick_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('deferred', True), ('state', 'queued')), fields=['run_at'], name='jobs_job_deferred_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('state', 'running')), fields=['queue'], name='jobs_job_running_queue_idx'),
        ),
        migrations.AddConstraint(
            model_name='queuecontrol',
            constraint=models.CheckConstraint(condition=models.Q(('concurrency_limit__isnull', True), ('concurrency_limit__range', (1, 100000)), _connector='OR'), name='jobs_queuecontrol_limit_range'),
        ),
        migrations.RunPython(forwards, backwards),
    ]
