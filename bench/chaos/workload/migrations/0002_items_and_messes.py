from django.db import migrations, models

# Every row an accepted INSERT or DELETE of chaos_chaositem touched is recorded, with what the
# job row said in that statement's own snapshot (STABLE, like 0001's chaos_audit: the snapshot
# the statement's own fence check used). An INSERT's writer is its row's token; a DELETE's are
# the deleters fenced_delete names in the transaction-local `palisade.fenced_deleters` (the OLD
# row's token is its previous writer's): none named is recorded with no writer, a violation.
TRIGGER = """
CREATE FUNCTION chaos_record_change(o text, r bigint, j bigint, a int, ja int, s text)
RETURNS void LANGUAGE sql VOLATILE AS $$
  INSERT INTO chaos_acceptedchange (op, item_id, job_id, attempt, job_attempt, job_state, at)
  VALUES (o, r, j, a, ja, s, clock_timestamp()) $$;

CREATE FUNCTION chaos_item_audit() RETURNS trigger LANGUAGE plpgsql STABLE AS $$
DECLARE
  fences text[];
  fence text;
  item bigint;
  j bigint;
  a int;
BEGIN
  IF TG_OP = 'INSERT' THEN
    item := NEW.id;
    fences := ARRAY[coalesce(NEW.fence_job_id::text, '') || ':' || NEW.fence_attempt];
  ELSE
    item := OLD.id;
    fences := string_to_array(
      coalesce(current_setting('palisade.fenced_deleters', true), ''), ' ');
    IF cardinality(fences) = 0 THEN
      fences := ARRAY[':'];
    END IF;
  END IF;
  FOREACH fence IN ARRAY fences LOOP
    j := nullif(split_part(fence, ':', 1), '')::bigint;
    a := nullif(split_part(fence, ':', 2), '')::int;
    PERFORM chaos_record_change(lower(TG_OP), item, j, a, n.attempt, n.state)
    FROM (SELECT 1) one LEFT JOIN chaos_job_now(j) n ON true;
  END LOOP;
  RETURN NULL;
END $$;

CREATE TRIGGER chaos_item_audit AFTER INSERT OR DELETE ON chaos_chaositem
FOR EACH ROW EXECUTE FUNCTION chaos_item_audit();
"""


class Migration(migrations.Migration):
    dependencies = [("chaos", "0001_initial"), ("jobs", "0025_fence_inserts_and_deletes")]

    operations = [
        migrations.CreateModel(
            name="ChaosItem",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("fence_job_id", models.BigIntegerField(blank=True, editable=False, null=True)),
                ("fence_attempt", models.IntegerField(default=0, editable=False)),
                ("job", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("name", models.CharField(max_length=20)),
            ],
            options={"abstract": False},
        ),
        migrations.CreateModel(
            name="AcceptedChange",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("op", models.CharField(max_length=6)),
                ("item_id", models.BigIntegerField()),
                ("job_id", models.BigIntegerField(null=True)),
                ("attempt", models.IntegerField(null=True)),
                ("job_attempt", models.IntegerField(null=True)),
                ("job_state", models.CharField(max_length=20, null=True)),
                ("at", models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name="MessMark",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
            ],
        ),
        migrations.RunSQL(TRIGGER),
    ]
