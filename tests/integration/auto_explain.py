"""The plans PostgreSQL runs on Django's connection, as auto_explain reports them to the client.

`auto_explain` (shipped with PostgreSQL) logs each statement's plan; at log_level notice the
server sends it to this client, nested statements included (a PL/pgSQL function's queries), so a
test reads the plan a statement really ran with -- prepared or not, inside a function or not.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


@contextmanager
def plans(analyze: bool = False) -> Iterator[list[str]]:
    """Collect the plan of every statement this connection runs inside the block (with actual
    row counts when `analyze`)."""
    settings = {
        "log_min_duration": "0",
        "log_nested_statements": "on",
        "log_level": "'notice'",
        "log_analyze": "on" if analyze else "off",
    }
    with connection.cursor() as cur:
        cur.execute("LOAD 'auto_explain'")
        for name, value in settings.items():
            cur.execute(f"SET auto_explain.{name} = {value}")
    seen: list[str] = []
    raw = connection.connection

    def keep(diag) -> None:  # type: ignore[no-untyped-def]
        if "Query Text" in (diag.message_primary or ""):
            seen.append(diag.message_primary)

    raw.add_notice_handler(keep)
    try:
        yield seen
    finally:
        raw.remove_notice_handler(keep)
        with connection.cursor() as cur:
            for name in settings:
                cur.execute(f"RESET auto_explain.{name}")
