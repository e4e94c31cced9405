"""Every SQL statement of the job platform, behind one driver per database vendor.

jobs/core/sql/rows.py holds the row types; base.py the statements both vendors share and the
driver interface; postgres.py and sqlite.py hold each vendor's hot path. Nothing outside this
package writes SQL text for the job tables.
"""

from jobs.core.sql.base import (
    ClaimedRow,
    CommitRow,
    Driver,
    ExpiredRow,
    FenceRow,
    IntentRow,
    dumps,
    loads,
)
from jobs.core.sql.postgres import PostgresDriver
from jobs.core.sql.sqlite import SqliteDriver

__all__ = [
    "ClaimedRow",
    "CommitRow",
    "Driver",
    "ExpiredRow",
    "FenceRow",
    "IntentRow",
    "PostgresDriver",
    "SqliteDriver",
    "driver_for",
    "dumps",
    "loads",
]

_DRIVERS: dict[str, Driver] = {"postgresql": PostgresDriver(), "sqlite": SqliteDriver()}


def driver_for(vendor: str) -> Driver:
    try:
        return _DRIVERS[vendor]
    except KeyError:
        raise RuntimeError(f"Palisade supports PostgreSQL and SQLite, not {vendor!r}") from None
