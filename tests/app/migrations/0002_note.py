import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("demo", "0001_initial"),
        ("tests_app", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Note",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("fence_job_id", models.BigIntegerField(blank=True, editable=False, null=True)),
                ("fence_attempt", models.IntegerField(default=0, editable=False)),
                ("text", models.CharField(blank=True, default="", max_length=50)),
                (
                    "report",
                    models.ForeignKey(
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to="demo.report",
                    ),
                ),
            ],
            options={"abstract": False},
        ),
    ]
