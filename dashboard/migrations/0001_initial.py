"""Dashboard permissions, the read-only "operators" group, the live-update trigger and one index.

The trigger: a STATEMENT-level AFTER INSERT trigger on jobs_jobevent sends one pg_notify per
statement, carrying only the newest event id of that statement. A claim of 8 jobs is one statement,
so it costs one notification, not eight; the payload is tiny and NOTIFY is delivered only when the
writer's transaction commits, so a listener never sees an event it cannot read. The ASGI process
LISTENs and then reads the events themselves (id > last seen) -- the table is the message.

No GIN index on payload: every transition is a non-HOT update of jobs_job (updated_at is indexed),
so each index costs an insertion on the workers' hot path. Payload search is bounded instead (see
dashboard/selectors.py). unique_key gets a partial btree index: only keyed rows pay for it.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION dashboard_notify_events() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('jobs_events', (SELECT max(id)::text FROM new_events));
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER dashboard_jobevent_notify
    AFTER INSERT ON jobs_jobevent
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION dashboard_notify_events();

CREATE INDEX IF NOT EXISTS dashboard_job_unique_key_idx
    ON jobs_job (unique_key) WHERE unique_key IS NOT NULL;
"""

DROP = """
DROP INDEX IF EXISTS dashboard_job_unique_key_idx;
DROP TRIGGER IF EXISTS dashboard_jobevent_notify ON jobs_jobevent;
DROP FUNCTION IF EXISTS dashboard_notify_events();
"""


def trigger_forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)
    else:
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS dashboard_job_unique_key_idx "
            "ON jobs_job (unique_key) WHERE unique_key IS NOT NULL"
        )


def trigger_backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)
    else:
        schema_editor.execute("DROP INDEX IF EXISTS dashboard_job_unique_key_idx")


def operators_group(apps, schema_editor):
    """The read-only role: sees every screen, presses nothing."""
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="operators")
    group.permissions.add(
        Permission.objects.get(content_type__app_label="dashboard", codename="view_dashboard")
    )


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0002_notify_trigger"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [
        migrations.CreateModel(
            name="Access",
            fields=[("id", models.BigAutoField(primary_key=True, serialize=False))],
            options={
                "managed": False,
                "default_permissions": (),
                "permissions": [
                    ("view_dashboard", "Can see the operations dashboard (read-only)"),
                    ("run_drill", "Can run the zombie drill from the dashboard"),
                ],
            },
        ),
        migrations.RunPython(trigger_forwards, trigger_backwards),
        migrations.RunPython(operators_group, migrations.RunPython.noop),
    ]
