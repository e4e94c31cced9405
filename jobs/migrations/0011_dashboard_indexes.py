"""Indexes for the dashboard's jobs-list filters: kind, queue, state and created_at, each then
`id` (walked backwards: the list is newest first), so a filter's first page is one short index
scan -- a filter matching nothing (`kind=nope`, `until=2000-01-01`) reads a page of the index,
not the table.

Built CONCURRENTLY on PostgreSQL (this migration is not atomic): the job table is written by every
transition, and a plain CREATE INDEX would block enqueues and the workers' writes for the whole
build (seconds per index at a million rows). IF NOT EXISTS makes a re-run after an interrupted
build finish the job; an interrupted CONCURRENTLY build leaves an INVALID index, which
`DROP INDEX` then this migration again replaces. On SQLite a plain CREATE INDEX (nothing else is
writing during `migrate` there). Each index costs every transition one more index insertion
(updates of jobs_job are never HOT: updated_at is indexed); docs/dashboard.md has the figures.
"""

from django.db import migrations, models

INDEXES = {
    "jobs_job_kind_id_idx": ("kind", "id"),
    "jobs_job_queue_id_idx": ("queue", "id"),
    "jobs_job_state_id_idx": ("state", "id"),
    "jobs_job_created_id_idx": ("created_at", "id"),
}


def create(apps, schema_editor):
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    for name, columns in INDEXES.items():
        schema_editor.execute(
            f"CREATE INDEX {concurrently}IF NOT EXISTS {name} ON jobs_job ({', '.join(columns)})"
        )


def drop(apps, schema_editor):
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("jobs", "0010_queue_controls"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create, drop)],
            state_operations=[
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(fields=["kind", "id"], name="jobs_job_kind_id_idx"),
                ),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(fields=["queue", "id"], name="jobs_job_queue_id_idx"),
                ),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(fields=["state", "id"], name="jobs_job_state_id_idx"),
                ),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(fields=["created_at", "id"], name="jobs_job_created_id_idx"),
                ),
            ],
        ),
    ]
