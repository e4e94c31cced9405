"""The foreign keys that reference jobs_job refuse a delete with RESTRICT, not NO ACTION (the
retention prune's cost per job; issue 20, the soak).

Django declares every foreign key `DEFERRABLE INITIALLY DEFERRED` with no ON DELETE clause: NO
ACTION. PostgreSQL then checks each deleted job row, for each of the five tables that reference
jobs_job (idempotency keys, rejected writes, intents, staged outputs, schedules), with two
queries: is the key still present in jobs_job (NO ACTION lets a row with the same key come back
before the check), then the referencing table. RESTRICT asks only the second, at the DELETE. The
prune deletes every referencing row first (jobs.ops.retention), so each check finds nothing;
measured (50,000 finished jobs, `manage.py jobs prune`, two runs each): 7.4-7.5 s with NO ACTION,
4.6-4.7 s with RESTRICT, 2.8-3.1 s with no keys at all -- the keys' checks were 60 % of the
prune's time and, at a stream of thousands of jobs a second, more of the database's CPU than the
drain's own statements (docs/benchmarks.md, the eleventh session).

What stays the same: the constraint names, the columns, the checks of an inserted or updated
referencing row (still deferred to COMMIT), and every delete Django makes (its collector deletes
or nulls the referencing rows before the job, on_delete as the models say). What changes: a raw
`DELETE FROM jobs_job` of a job that something still references fails at that statement rather
than at COMMIT. Identity keys never come back, so NO ACTION's extra allowance is never used.

Each key is dropped and added again NOT VALID in a short transaction of its own, then VALIDATEd
in another. Dropping a foreign key takes an ACCESS EXCLUSIVE lock on jobs_job itself (and on the
referencing table): every read and write of jobs_job waits while it is held. In one transaction
for the whole migration (as first written) that lock lasted through all five keys' VALIDATE
scans, and a wait for one referencing table's lock (a long report reading it) stalled the job
table meanwhile; here it lasts only its own key's drop and add (catalog changes), and VALIDATE
takes SHARE UPDATE EXCLUSIVE on the referencing table and ROW SHARE on jobs_job, which block no
claim, commit or enqueue (`test_migration_0026_holds_the_job_table_only_for_each_key_s_swap`).
Interrupted between keys, the migration is not recorded and runs again from the first key:
each key is found by its column, whatever its action, and swapped again. Django does not track
ON DELETE in its migration state: a later AlterField of one of these fields would recreate its
key as NO ACTION, which tests/integration/test_retention.py's catalog test catches.
Backwards: NO ACTION again.
"""

from django.db import migrations, transaction

# The referencing (table, column)s: those of the jobs app's own models.
REFERENCES = (
    ("jobs_idempotencykey", "job_id"),
    ("jobs_rejectedwrite", "job_id"),
    ("jobs_intent", "job_id"),
    ("jobs_stagedoutput", "job_id"),
    ("jobs_schedule", "last_job_id"),
)

FIND = """
SELECT c.conname FROM pg_constraint c
  JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
 WHERE c.contype = 'f' AND c.confrelid = 'jobs_job'::regclass
   AND c.conrelid = %s::regclass AND a.attname = %s AND cardinality(c.conkey) = 1
"""


def _rewrite(schema_editor, on_delete: str) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite: Django's own keys as they are
    quote = schema_editor.quote_name
    alias = schema_editor.connection.alias
    for table, column in REFERENCES:
        with transaction.atomic(using=alias), schema_editor.connection.cursor() as cur:
            cur.execute(FIND, [table, column])
            names = [row[0] for row in cur.fetchall()]
            for name in names:  # jobs_job locked ACCESS EXCLUSIVE from here to this COMMIT
                cur.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(name)}")
                cur.execute(
                    f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(name)} "
                    f"FOREIGN KEY ({quote(column)}) REFERENCES jobs_job (id) "
                    f"ON DELETE {on_delete} DEFERRABLE INITIALLY DEFERRED NOT VALID"
                )
        for name in names:  # the scan, with writes to both tables going on
            with transaction.atomic(using=alias), schema_editor.connection.cursor() as cur:
                cur.execute(f"ALTER TABLE {quote(table)} VALIDATE CONSTRAINT {quote(name)}")


def forwards(apps, schema_editor):
    _rewrite(schema_editor, "RESTRICT")


def backwards(apps, schema_editor):
    _rewrite(schema_editor, "NO ACTION")


class Migration(migrations.Migration):
    atomic = False  # a transaction per key (see above), never one around them all

    dependencies = [
        ("jobs", "0025_fence_inserts_and_deletes"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
