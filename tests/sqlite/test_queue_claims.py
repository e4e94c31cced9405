"""Every claim and queue-control test of tests/integration/test_queue_claims.py, on SQLite."""

from tests.integration import test_queue_claims as shared

pytestmark = shared.pytestmark
fresh_limits = shared.fresh_limits
globals().update({name: getattr(shared, name) for name in dir(shared) if name.startswith("test_")})
