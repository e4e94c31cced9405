"""/metrics on the embedded SQLite database: a planted row stays with itself there too."""

from tests.ops.test_metrics import (
    test_a_malformed_expired_event_is_skipped_and_counted_alone,
    token,
)

__all__ = ["test_a_malformed_expired_event_is_skipped_and_counted_alone", "token"]
