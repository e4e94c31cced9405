"""Every transition test of tests/integration/test_transitions.py, run again on SQLite.

The same functions, not copies: a claim, each fenced write rejecting a stale attempt and being
recorded, commits, failures with retry, and the reaper -- against the SQLite driver this time.
Only the PostgreSQL query-plan test skips (it reads PostgreSQL's EXPLAIN).
"""

from tests.integration import test_transitions as shared

pytestmark = shared.pytestmark
globals().update({name: getattr(shared, name) for name in dir(shared) if name.startswith("test_")})
