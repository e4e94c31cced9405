"""Each intent's lane, stored (jobs/core/lanes.py): the relay's claim leaves a full lane out by
that stored value, so one receiver whose URL is spelled many ways (HTTP://h, http://h:80,
http://user@h) is one lane in SQL as in the relay's count.

An index of open intents' lanes lets that claim skip a full lane's backlog (the exclusion is
spelled as ranges, jobs.effects.outbox._outside), built after the backfill.

Not atomic: the column is added with a constant default (PostgreSQL only records it: no rewrite),
the existing rows are filled CHUNK at a time, each chunk its own short transaction, and the index
is built CONCURRENTLY on PostgreSQL, so commits inserting intents never wait for the whole
migration. The backfill computes with the current jobs.core.lanes.lane, as the commit does.
Backwards: the index and the column are dropped.
"""

from django.db import migrations, models, transaction
from django.db.models import Q

from jobs.core import lanes

CHUNK = 1000
OPEN_LANE = models.Index(
    fields=["lane"],
    condition=Q(state__in=["pending", "performing"]),
    name="jobs_intent_open_lane_idx",
)


def backfill(apps, schema_editor):  # type: ignore[no-untyped-def]
    db = schema_editor.connection.alias
    rows = apps.get_model("jobs", "Intent").objects.using(db)
    last = 0
    while True:
        with transaction.atomic(using=db):
            # By id alone: a filter on the new column, which has no statistics yet, made
            # PostgreSQL read every later row for each chunk.
            chunk = list(
                rows.filter(pk__gt=last).order_by("pk").values_list("pk", "target", "data")[:CHUNK]
            )
            if not chunk:
                return
            named = [(lanes.lane(target, data), pk) for pk, target, data in chunk]
            with schema_editor.connection.cursor() as cur:
                if schema_editor.connection.vendor == "postgresql":  # one statement a chunk
                    cur.execute(
                        "UPDATE jobs_intent SET lane = v.lane "
                        "FROM unnest(%s::text[], %s::bigint[]) AS v(lane, id) "
                        "WHERE jobs_intent.id = v.id AND jobs_intent.lane = ''",
                        [[lane for lane, _ in named], [pk for _, pk in named]],
                    )
                else:
                    cur.executemany(
                        "UPDATE jobs_intent SET lane = %s WHERE id = %s AND lane = ''", named
                    )
        last = chunk[-1][0]


def _concurrently(schema_editor):  # type: ignore[no-untyped-def]
    return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}


def add_index(apps, schema_editor):  # type: ignore[no-untyped-def]
    intent = apps.get_model("jobs", "Intent")
    schema_editor.add_index(intent, OPEN_LANE, **_concurrently(schema_editor))


def remove_index(apps, schema_editor):  # type: ignore[no-untyped-def]
    intent = apps.get_model("jobs", "Intent")
    schema_editor.remove_index(intent, OPEN_LANE, **_concurrently(schema_editor))


class Migration(migrations.Migration):
    atomic = False  # the backfill's chunks commit one by one; CREATE INDEX CONCURRENTLY

    dependencies = [
        ("jobs", "0023_fence_at_commit"),
    ]

    operations = [
        migrations.AddField(
            model_name="intent",
            name="lane",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="the target, with the normalised origin of data['url'] (jobs.core.lanes)",
                max_length=200,
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_index, remove_index)],
            state_operations=[migrations.AddIndex(model_name="intent", index=OPEN_LANE)],
        ),
    ]
