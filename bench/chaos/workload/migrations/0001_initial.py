from django.db import migrations, models

# The audit trigger reads the job row through a STABLE function, so it sees the snapshot of the
# UPDATE that fired it: exactly what that statement's own fence check saw.
TRIGGER = """
CREATE FUNCTION chaos_job_now(jid bigint) RETURNS TABLE (attempt int, state text)
LANGUAGE sql STABLE AS $$ SELECT attempt, state FROM jobs_job WHERE id = jid $$;

CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE a int; s text;
BEGIN
  IF NEW.fence_job_id IS DISTINCT FROM OLD.fence_job_id
     OR NEW.fence_attempt IS DISTINCT FROM OLD.fence_attempt OR NEW.body <> OLD.body THEN
    SELECT n.attempt, n.state INTO a, s FROM chaos_job_now(NEW.fence_job_id) n;
    INSERT INTO chaos_acceptedwrite (row_id, job_id, attempt, job_attempt, job_state, at)
    VALUES (NEW.id, NEW.fence_job_id, NEW.fence_attempt, a, s, clock_timestamp());
  END IF;
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
