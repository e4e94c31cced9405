"""No database foreign key on jobs_attempt.job_id and jobs_jobevent.job_id (issue 20, the drain).

Each row inserted into a table with a foreign key fires PostgreSQL's referential-integrity
check: a query against jobs_job that takes a FOR KEY SHARE lock on the job's row, written to
the WAL. The drain inserts three such rows per job (the claim's attempt and event, the commit's
event) and the enqueue one (its event), each against a row the same statement has just inserted
or updated. Measured (`bench/work_per_job.py --mode sql --jobs 16000`, four alternated pairs on
one machine): the database's CPU per job 258/244/276/228 us with the keys, 209/202/204/209 us
without (about -18 %); docs/benchmarks.md has the run. Oban, River and GoodJob keep no
foreign keys on their job tables for the same reason.

What keeps the rows right without the check: every attempt, and every event of the hot path,
takes its job_id from the job row the same statement updates or inserts (jobs.core.sql: claim,
commit, fail, release, reclaim, poison, requeue, cancel; the enqueue); a job is deleted only by
Django's collector (`on_delete=CASCADE` stays on the model: the admin, `Job.delete()`,
querysets) or by retention's SQL cascade (jobs.ops.retention), both of which delete the job's
attempts and events with it. Tested in tests/integration/test_history_integrity.py.

Hazard: the rarer event writers (jobs.effects, the janitor, the outbox relay, jobs.ops.intents,
jobs.worker.unresolved) read their job's row in their transaction but do not lock it, so a
prune deleting that job at the same moment can leave one event row whose job is gone (with the
key, their commit failed instead). Nothing reads events but by job, so such a row is never shown;
it is only space.

Dropping a constraint takes a brief ACCESS EXCLUSIVE lock on both tables: it waits for running
statements, then holds for milliseconds. The other foreign keys (rejected writes, effects,
outputs, intents, schedules) are off the drain's path and keep theirs.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0016_drain"),
    ]

    operations = [
        migrations.AlterField(
            model_name="attempt",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="attempts",
                to="jobs.job",
            ),
        ),
        migrations.AlterField(
            model_name="jobevent",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="events",
                to="jobs.job",
            ),
        ),
    ]
