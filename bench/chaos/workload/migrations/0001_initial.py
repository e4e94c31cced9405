from django.db import migrations, models

# Every row an UPDATE of chaos_chaosrow changed is recorded -- even when it wrote the values the
# row already held (a long job's loop writes the same body each round, so a zombie's stale write
# onto rows it wrote itself changes nothing and must still be seen). Only fenced_write updates the
# table; a refused write is rolled back (its savepoint, or its transaction) and its audit rows
# with it. The trigger function is STABLE, so its query -- and chaos_job_now, STABLE too -- reads
# the job row in the snapshot of the UPDATE that fired it: exactly what that statement's own fence
# check saw, not a reclaim committed since (a VOLATILE function would take a fresh snapshot).
# A STABLE function may not INSERT itself; it calls chaos_record, a VOLATILE one, to store the row.
TRIGGER = """
CREATE FUNCTION chaos_job_now(jid bigint) RETURNS TABLE (attempt int, state text)
LANGUAGE sql STABLE AS $$ SELECT attempt, state FROM jobs_job WHERE id = jid $$;

CREATE FUNCTION chaos_record(r int, j bigint, a int, ja int, s text) RETURNS void
LANGUAGE sql VOLATILE AS $$
  INSERT INTO chaos_acceptedwrite (row_id, job_id, attempt, job_attempt, job_state, at)
  VALUES (r, j, a, ja, s, clock_timestamp()) $$;

CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql STABLE AS $$
BEGIN
  PERFORM chaos_record(NEW.id, NEW.fence_job_id, NEW.fence_attempt, n.attempt, n.state)
  FROM (SELECT 1) one LEFT JOIN chaos_job_now(NEW.fence_job_id) n ON true;
  RETURN NEW;
END $$;

CREATE TRIGGER chaos_audit AFTER UPDATE ON chaos_chaosrow
FOR EACH ROW EXECUTE FUNCTION chaos_audit();
"""


class Migration(migrations.Migration):
    initial = True
    dependencies = [("jobs", "0007_event_types_merged")]

    operations = [
        migrations.CreateModel(
            name="ChaosRow",
            fields=[
                ("id", models.AutoField(primary_key=True, serialize=False)),
                ("fence_job_id", models.BigIntegerField(blank=True, editable=False, null=True)),
                ("fence_attempt", models.IntegerField(default=0, editable=False)),
                ("body", models.CharField(default="", max_length=100)),
            ],
            options={"abstract": False},
        ),
        migrations.CreateModel(
            name="AcceptedWrite",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("row_id", models.IntegerField()),
                ("job_id", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("job_attempt", models.IntegerField(null=True)),
                ("job_state", models.CharField(max_length=20, null=True)),
                ("at", models.DateTimeField()),
            ],
        ),
        migrations.RunSQL(TRIGGER),
    ]
