"""jobs_job's autovacuum runs unthrottled (`autovacuum_vacuum_cost_delay = 0`, this table only;
issue 20, the soak).

Every claim and every commit leaves a dead version of the job's row and of its entries in the
claim's partial indexes, at their head, and the claim steps over each until a vacuum removes it
(docs/operations.md). At a stream of thousands of jobs a second, stock autovacuum's throttle
(2 ms asleep per 200 pages' cost) stretched each run of jobs_job to 20-30 s of a one-minute
cycle, so the table held 300,000-800,000 dead rows and the claim slowed with them (soak,
docs/benchmarks.md, the eleventh session). Unthrottled, a run reads and writes as fast as the
server can; jobs_job is the table retention keeps small, and the setting is this table's only
(ALTER TABLE ... SET: a SHARE UPDATE EXCLUSIVE lock, instant, which waits for a running vacuum).
A server whose operator wants another value sets it again after migrating: later migrations do
not touch it. Backwards: RESET (the server's setting again).
"""

from django.db import migrations


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_job SET (autovacuum_vacuum_cost_delay = 0)")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_job RESET (autovacuum_vacuum_cost_delay)")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0026_restrict_job_deletes"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
