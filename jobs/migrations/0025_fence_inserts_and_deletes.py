"""The COMMIT's check of token-checked writes covers fenced_create and fenced_delete too
(jobs/core/sql/fenced.py).

`jobs_fence_at_commit()` learns DELETE: a deleted row's OLD token is its previous writer's, so
the deleters are read from the transaction-local setting `palisade.fenced_deleters`
("<job_id>:<attempt> ..."), each of which must still own its running job (none named: refused).
INSERT is checked like UPDATE, by NEW's token. The `post_migrate` that follows adds two triggers
beside each FencedRow table's UPDATE one, which stays as 0023 made it (no DROP, no ACCESS
EXCLUSIVE lock, and a worker of the previous release still running keeps finding its trigger):
AFTER INSERT, and AFTER DELETE queued only by fenced_delete's own setting value. Backwards:
0023's function (the added triggers then fire only for this version's calls).
"""

import importlib

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION jobs_fence_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    fences text[];
    fence text;
    fence_job bigint;
    fence_attempt integer;
BEGIN
    IF TG_OP = 'DELETE' THEN
        fences := string_to_array(
            coalesce(current_setting('palisade.fenced_deleters', true), ''), ' ');
        IF cardinality(fences) = 0 THEN
            fences := ARRAY['0:0'];  -- a marked delete with no deleter named: refused
        END IF;
    ELSE
        fences := ARRAY[NEW.fence_job_id || ':' || NEW.fence_attempt];
    END IF;
    FOREACH fence IN ARRAY fences LOOP
        fence_job := split_part(fence, ':', 1)::bigint;
        fence_attempt := split_part(fence, ':', 2)::integer;
        PERFORM 1 FROM jobs_job
         WHERE id = fence_job AND attempt = fence_attempt AND state = 'running'
           FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING
                MESSAGE = 'stale token-checked ' || lower(TG_OP) || ' of ' || TG_ARGV[0]
                    || ': job ' || coalesce(fence_job::text, 'none') || ' attempt '
                    || coalesce(fence_attempt::text, 'none') || ' no longer owns the job at COMMIT',
                ERRCODE = 'check_violation', CONSTRAINT = 'jobs_fence_at_commit',
                TABLE = TG_TABLE_NAME, DETAIL = TG_ARGV[0];
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        previous = importlib.import_module("jobs.migrations.0023_fence_at_commit")
        schema_editor.execute(previous.CREATE)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0024_intent_lane"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
