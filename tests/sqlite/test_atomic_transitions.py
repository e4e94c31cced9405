"""The all-or-nothing transitions of tests/integration/test_atomic_transitions.py on SQLite.

The same functions, not copies: a release, a reclaim and a poison whose event row is refused
(a trigger) leave nothing behind on SQLite's driver too. (The connection-cut tests need
PostgreSQL's pg_terminate_backend and run on that tier only.)
"""

from tests.integration import test_atomic_transitions as shared

pytestmark = shared.pytestmark
globals().update(
    {name: getattr(shared, name) for name in dir(shared) if name.startswith("test_refused_")}
)
