"""tests/integration/test_enqueue.py's unique-key tests, run again on SQLite.

SQLite always takes enqueue's savepoint path (Job.objects._enqueue_with_savepoint), which
PostgreSQL takes only when its one statement cannot decide: a duplicate of a queued or running
holder returns it there too, a terminal holder frees the key, and a duplicate inside the
caller's transaction leaves it usable.
"""

from tests.integration import test_enqueue as shared

pytestmark = shared.pytestmark
SHARED = (
    "test_a_duplicate_unique_key_returns_the_live_job",
    "test_a_key_held_by_a_queued_or_running_job_returns_that_job_and_writes_nothing",
    "test_a_unique_key_is_free_again_once_its_job_is_terminal",
    "test_a_duplicate_inside_the_callers_transaction_leaves_it_usable",
)
globals().update({name: getattr(shared, name) for name in SHARED})
