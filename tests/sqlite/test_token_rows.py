"""Every token-checked insert and delete test of tests/integration/test_token_rows.py, run again
on SQLite (the same functions): one writer, so the statement's own job check decides."""

from tests.integration import test_token_rows as shared

pytestmark = shared.pytestmark
globals().update({name: getattr(shared, name) for name in dir(shared) if name.startswith("test_")})
