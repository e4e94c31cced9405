"""The timeline's rescue mark on SQLite (its JSON functions read the event's data)."""

from tests.dashboard.conftest import operator, operator_client
from tests.dashboard.test_rescue_timeline import (
    test_a_lease_that_ran_out_stays_a_plain_expiry,
    test_a_rescued_attempt_is_marked_as_its_worker_process_dying,
    test_a_rescued_attempt_is_no_zombie_suspect_on_the_workers_page,
    test_an_expired_event_that_only_looks_like_a_rescue_is_a_plain_expiry,
)

__all__ = [
    "operator",
    "operator_client",
    "test_a_lease_that_ran_out_stays_a_plain_expiry",
    "test_a_rescued_attempt_is_marked_as_its_worker_process_dying",
    "test_a_rescued_attempt_is_no_zombie_suspect_on_the_workers_page",
    "test_an_expired_event_that_only_looks_like_a_rescue_is_a_plain_expiry",
]
