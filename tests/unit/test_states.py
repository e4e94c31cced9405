from jobs.core.states import (
    ALLOWED_TRANSITIONS,
    LIVE_STATES,
    TERMINAL_STATES,
    AttemptOutcome,
    JobState,
    can_transition,
)
from jobs.models import Attempt, Job


def _constraint(model, name):
    return next(c for c in model._meta.constraints if c.name == name)


def test_every_state_is_either_live_or_terminal():
    assert LIVE_STATES | TERMINAL_STATES == set(JobState)
    assert not LIVE_STATES & TERMINAL_STATES


def test_terminal_states_are_left_only_by_an_operator_requeue():
    for source, target in ALLOWED_TRANSITIONS:
        if source in TERMINAL_STATES:
            assert target == JobState.QUEUED
    assert not can_transition(JobState.SUCCEEDED, JobState.QUEUED)


def test_only_a_claim_enters_running():
    into_running = {s for s, t in ALLOWED_TRANSITIONS if t == JobState.RUNNING}
    assert into_running == {JobState.QUEUED}


def test_a_running_job_can_reach_every_terminal_state():
    for terminal in TERMINAL_STATES:
        assert can_transition(JobState.RUNNING, terminal)


def test_the_state_check_constraint_lists_exactly_the_enum():
    check = _constraint(Job, "jobs_job_state_valid")
    assert set(check.condition.rhs) == set(JobState.values)


def test_the_outcome_check_constraint_lists_exactly_the_enum():
    check = _constraint(Attempt, "jobs_attempt_outcome_valid")
    assert set(check.condition.rhs) == set(AttemptOutcome.values)


def test_the_model_field_choices_follow_the_enums():
    assert [v for v, _ in Job._meta.get_field("state").choices] == JobState.values
    assert [v for v, _ in Attempt._meta.get_field("outcome").choices] == AttemptOutcome.values
