"""Test settings of the SQLite tier: the embedded default `bin/run` uses, on a file database.

The file lives in a temporary directory outside the repository (`PALISADE_SQLITE_PATH`, which
`bin/test` sets; one of our own otherwise). pytest-django's test database is a *file* beside it,
not SQLite's in-memory default, so a second connection, a thread and a `qcluster` subprocess all
see the same database -- the races and the drain below need that.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ["DATABASE_URL"] = ""  # unset: config.settings picks the embedded SQLite file
if not os.environ.get("PALISADE_SQLITE_PATH"):
    tmp = Path(tempfile.mkdtemp(prefix="palisade-sqlite-tests-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    os.environ["PALISADE_SQLITE_PATH"] = str(tmp / "palisade.sqlite3")

from tests.settings import *  # noqa: E402,F403
from tests.settings import DATABASES  # noqa: E402

_name = Path(DATABASES["default"]["NAME"])
DATABASES["default"]["TEST"] = {"NAME": str(_name.with_name(f"test_{_name.name}"))}
