"""The state and outcome CHECK constraints (migration 0020_constant_check_arrays): each stored
with one array constant, so no write statement folds an array expression for them again, and
each still rejecting exactly what it rejected; Django's model validation evaluates them too; the
migration goes back to 0019's forms and forward again.
"""

import re

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from jobs.core.states import AttemptOutcome, JobState
from jobs.models import Attempt, Intent, Job, StagedOutput

CHANGED = {
    "jobs_job_state_valid": set(JobState.values),
    "jobs_job_finished_iff_terminal": {"succeeded", "failed", "cancelled"},
    "jobs_attempt_outcome_valid": set(AttemptOutcome.values),
    "jobs_intent_state_valid": set(Intent.State.values),
    "jobs_staged_status_valid": set(StagedOutput.Status.values),
}
CONSTANT = re.compile(r"ANY \('\{([a-z_,]+)\}'::text\[\]\)")


def definitions() -> dict[str, tuple[str, bool]]:
    """Each changed constraint's stored definition, and whether it is validated."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conname, pg_get_constraintdef(oid), convalidated FROM pg_constraint "
            "WHERE contype = 'c' AND conname = ANY(%s)",
            [list(CHANGED)],
        )
        return {name: (definition, valid) for name, definition, valid in cur.fetchall()}


def test_each_check_is_stored_with_one_array_constant_of_exactly_its_values(db):
    stored = definitions()
    assert set(stored) == set(CHANGED)
    for name, (definition, valid) in stored.items():
        assert valid, name
        assert "ARRAY[" not in definition, definition
        constants = CONSTANT.findall(definition)
        assert constants, definition
        for constant in constants:
            assert set(constant.split(",")) == CHANGED[name], definition


def rejected(sql: str, params: list[object]) -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, params)
    except IntegrityError:
        return True
    return False


def test_the_database_still_rejects_what_the_checks_forbid(make_job):
    queued = make_job()
    done = make_job(state=JobState.SUCCEEDED)
    running = make_job(state=JobState.RUNNING, attempt=1)
    job_update = "UPDATE jobs_job SET {} WHERE id = %s"
    assert rejected(job_update.format("state = 'bogus'"), [queued.pk])
    assert rejected(job_update.format("state = 'Queued'"), [queued.pk])
    # finished_at iff terminal, both ways
    assert rejected(job_update.format("state = 'failed'"), [queued.pk])
    assert rejected(job_update.format("finished_at = now()"), [queued.pk])
    assert rejected(job_update.format("finished_at = NULL"), [done.pk])
    assert rejected("UPDATE jobs_attempt SET outcome = 'won' WHERE job_id = %s", [running.pk])
    # ... and admit what they admitted
    assert not rejected(job_update.format("state = 'cancelled'"), [done.pk])
    assert not rejected(job_update.format("state = 'failed', finished_at = now()"), [queued.pk])
    assert not rejected("UPDATE jobs_attempt SET outcome = 'lost' WHERE job_id = %s", [running.pk])

    intent = Intent.objects.create(job=done, attempt=1, step="s", key=f"{done.pk}:s", target="t")
    staged = StagedOutput.objects.create(job=done, attempt=1, name="n", path="p")
    assert rejected("UPDATE jobs_intent SET state = 'sent' WHERE id = %s", [intent.pk])
    assert rejected("UPDATE jobs_stagedoutput SET status = 'kept' WHERE id = %s", [staged.pk])
    assert not rejected("UPDATE jobs_intent SET state = 'done' WHERE id = %s", [intent.pk])
    assert not rejected(
        "UPDATE jobs_stagedoutput SET status = 'orphaned' WHERE id = %s", [staged.pk]
    )


def test_model_validation_evaluates_the_checks(db):
    with pytest.raises(ValidationError, match="jobs_job_state_valid"):
        Job(kind="demo.noop", state="bogus").validate_constraints()
    with pytest.raises(ValidationError, match="jobs_job_finished_iff_terminal"):
        Job(kind="demo.noop", state=JobState.SUCCEEDED).validate_constraints()
    with pytest.raises(ValidationError, match="jobs_attempt_outcome_valid"):
        Attempt(number=1, outcome="won").validate_constraints(exclude={"job"})
    Job(kind="demo.noop", state=JobState.QUEUED).validate_constraints()
    Job(kind="demo.noop", state=JobState.FAILED, finished_at=timezone.now()).validate_constraints()


def test_the_migration_goes_back_to_the_array_expressions_and_forward_again(transactional_db):
    try:
        call_command("migrate", "jobs", "0019", verbosity=0)
        before = definitions()
        assert all("ARRAY[" in d and v for d, v in before.values()), before
    finally:
        call_command("migrate", "jobs", verbosity=0)
    after = definitions()
    assert all("ARRAY[" not in d and v for d, v in after.values()), after
    # and the constraints forward again still reject
    job = Job.objects.create(kind="demo.noop")
    assert rejected("UPDATE jobs_job SET state = 'bogus' WHERE id = %s", [job.pk])
