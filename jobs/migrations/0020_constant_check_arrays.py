"""The state and outcome CHECK constraints test one array constant, not an array expression
(issue 20: the enqueue's and the drain's server time).

PostgreSQL reads every CHECK constraint of a table back from its stored text and constant-folds
it in each INSERT and UPDATE statement (nothing caches it between statements). Django's
`Q(state__in=[...])` on a varchar column is stored as an ARRAY[...] of varchar literals coerced
to text[], which each statement folds element by element; jobs.models.checks.OneOf stores the
folded constant '{queued,...}'::text[] instead. Same rows admitted; measured in
docs/benchmarks.md ("constant CHECK arrays").

Constraints changed: jobs_job_state_valid, jobs_job_finished_iff_terminal,
jobs_attempt_outcome_valid, jobs_intent_state_valid, jobs_staged_status_valid.

Not atomic, on PostgreSQL: each constraint is swapped in one ALTER TABLE (DROP the old, ADD the
new NOT VALID: enforced for every write from that statement on, no moment without it; a brief
ACCESS EXCLUSIVE lock, no scan), committed, then VALIDATEd, which scans the table under SHARE
UPDATE EXCLUSIVE -- claims, commits and enqueues go on meanwhile. A plain AddConstraint would
scan a table of millions of jobs while holding the lock that stops them. SQLite (the fast suite)
rebuilds the table, as Django does for any constraint there.
"""

from django.db import migrations, models
from django.db.models import F, Q

from jobs.models.checks import OneOf

STATES = ["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL = ["succeeded", "failed", "cancelled"]
OUTCOMES = [
    "running", "succeeded", "failed", "rejected", "lost", "expired", "released", "cancelled",
    "requeued",
]  # fmt: skip
INTENT_STATES = ["pending", "performing", "done", "failed"]
STAGED = ["staged", "promoted", "discarded", "orphaned"]


def _finished_iff_terminal(terminal):  # type: ignore[no-untyped-def]
    return (terminal() & Q(finished_at__isnull=False)) | (~terminal() & Q(finished_at__isnull=True))


# (model, old condition, new condition, name)
CHANGES = [
    ("job", Q(state__in=STATES), OneOf(F("state"), STATES), "jobs_job_state_valid"),
    (
        "job",
        _finished_iff_terminal(lambda: Q(state__in=TERMINAL)),
        _finished_iff_terminal(lambda: OneOf(F("state"), TERMINAL)),
        "jobs_job_finished_iff_terminal",
    ),
    (
        "attempt",
        Q(outcome__in=OUTCOMES),
        OneOf(F("outcome"), OUTCOMES),
        "jobs_attempt_outcome_valid",
    ),
    (
        "intent",
        Q(state__in=INTENT_STATES),
        OneOf(F("state"), INTENT_STATES),
        "jobs_intent_state_valid",
    ),
    ("stagedoutput", Q(status__in=STAGED), OneOf(F("status"), STAGED), "jobs_staged_status_valid"),
]


def _swap(apps, schema_editor, to_new):  # type: ignore[no-untyped-def]
    for model_name, old, new, name in CHANGES:
        model = apps.get_model("jobs", model_name)
        gone = models.CheckConstraint(condition=new if not to_new else old, name=name)
        wanted = models.CheckConstraint(condition=new if to_new else old, name=name)
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.remove_constraint(model, gone)
            schema_editor.add_constraint(model, wanted)
            continue
        table = schema_editor.quote_name(model._meta.db_table)
        schema_editor.execute(
            f"ALTER TABLE {table} DROP CONSTRAINT {schema_editor.quote_name(name)},"
            f" ADD {wanted.constraint_sql(model, schema_editor)} NOT VALID"
        )
        # Not atomic: the swap is committed, so the scan below holds no lock writes wait for.
        schema_editor.execute(
            f"ALTER TABLE {table} VALIDATE CONSTRAINT {schema_editor.quote_name(name)}"
        )


def forward(apps, schema_editor):  # type: ignore[no-untyped-def]
    _swap(apps, schema_editor, to_new=True)


def backward(apps, schema_editor):  # type: ignore[no-untyped-def]
    _swap(apps, schema_editor, to_new=False)


def _state_operations():  # type: ignore[no-untyped-def]
    operations = []
    for model_name, _old, new, name in CHANGES:
        operations.append(migrations.RemoveConstraint(model_name=model_name, name=name))
        operations.append(
            migrations.AddConstraint(
                model_name=model_name, constraint=models.CheckConstraint(condition=new, name=name)
            )
        )
    return operations


class Migration(migrations.Migration):
    atomic = False  # the swap commits before VALIDATE scans (see above)

    dependencies = [
        ("jobs", "0019_pick_around_blocked_queues"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=_state_operations(),
        ),
    ]
