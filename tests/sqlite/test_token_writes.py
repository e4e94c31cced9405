"""Every token-write test of tests/integration/test_token_writes.py, run again on SQLite.

The same functions, not copies: the job's current attempt decides a token write on SQLite's
driver too, all or nothing, and a refusal met inside the handler's own transaction is recorded
once that transaction is over.
"""

from tests.integration import test_token_writes as shared

pytestmark = shared.pytestmark
globals().update({name: getattr(shared, name) for name in dir(shared) if name.startswith("test_")})
