"""Dashboard permissions, the read-only "operators" group and one index.

No trigger: the live dashboard polls jobs_jobevent by primary key (dashboard/live.py), so the
workers' hot path pays nothing for it. No GIN index on payload either: every transition is a
non-HOT update of jobs_job (updated_at is indexed), so each index costs an insertion on the hot
path; payload search is bounded instead (dashboard/selectors.py). unique_key gets a partial
btree index: only keyed rows pay for it.
"""

from django.contrib.auth.management import create_permissions
from django.db import migrations, models

INDEX = (
    "CREATE INDEX IF NOT EXISTS dashboard_job_unique_key_idx "
    "ON jobs_job (unique_key) WHERE unique_key IS NOT NULL"
)


def index_forwards(apps, schema_editor):
    schema_editor.execute(INDEX)


def index_backwards(apps, schema_editor):
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
        migrations.RunPython(index_forwards, index_backwards),
        migrations.RunPython(operators_group, migrations.RunPython.noop),
    ]
