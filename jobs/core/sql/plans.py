"""When the hot statements' plans are made again (PostgreSQL, prepared statements).

A prepared statement's generic plan is made once, from the tables' sizes at that moment, and is
kept for the connection's life unless something invalidates it (an ANALYZE or VACUUM of a table
it reads: autovacuum, when it runs). Made while jobs_attempt held a few hundred rows -- a fresh
install, a worker started on an empty table, a server with autovacuum off -- the commit's plan
reads the whole of jobs_attempt to find its batch's attempt rows (the cheapest plan for a tiny
table) and keeps doing so as the table grows: at 4,000 rows that scan was 1.0 of the commit's
1.4 ms, and it grows with the table.

So each hot statement's text ends with a comment naming a plan generation, which moves on as
this process's count of hot statements reaches 64, 256, 1,024, ... (x4), and every hour.
A new text is a new prepared statement, planned (5 custom plans, then the generic one) for the
tables as they are then. A claim's or commit's plan holds about 220 kB of the server's memory,
so a connection that runs hot statements keeps 32 (jobs.core.transitions.fence
HOT_PREPARED_MAX) plus the texts the newest generation added: psycopg deallocates the least
recently used one -- an older generation's -- as each new text first runs. The counter is per
process and only changes when plans are made, never what a statement does.
"""

import itertools
import time

FIRST = 64
GROWTH = 4
PERIOD_SECONDS = 3600.0

_calls = itertools.count(1)
_start = time.monotonic()


def generation(calls: int, seconds: float) -> tuple[int, int]:
    """(the count's generation, the hour) after `calls` statements, `seconds` in."""
    level, bound = 0, FIRST
    while calls >= bound:
        level, bound = level + 1, bound * GROWTH
    return level, int(seconds // PERIOD_SECONDS)


def tag() -> str:
    """The comment a hot statement's text ends with; counts one statement."""
    level, period = generation(next(_calls), time.monotonic() - _start)
    return f"\n/* plan {level}.{period} */"
