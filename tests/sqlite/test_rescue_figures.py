"""A rescue in /metrics and the lease hint, on SQLite (its JSON functions spell the test)."""

from tests.ops.test_rescue_figures import (
    test_a_rescued_jobs_next_claim_is_not_a_malformed_event,
    test_rescues_are_no_evidence_that_the_lease_is_too_short,
)

__all__ = [
    "test_a_rescued_jobs_next_claim_is_not_a_malformed_event",
    "test_rescues_are_no_evidence_that_the_lease_is_too_short",
]
