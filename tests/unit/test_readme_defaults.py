"""Numbers and defaults the README states outright, each read where it takes effect.

The behaviour behind them has tests of its own (named in docs/testing.md's "README promises and
their tests"); those tests read the constants, so a changed number would pass them while the
README went on promising the old one. These hold the README to its figures.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from config import websocket
from dashboard import consumers

PROJECT_DIR = Path(__file__).resolve().parents[2]
# What an operator may have exported that would change what these defaults read.
CHANGES_DEFAULTS = {"DATABASE_URL", "PALISADE_SQLITE_PATH", "Q_TIMEOUT", "DJANGO_SETTINGS_MODULE"}


def settings_as_bin_run_reads_them(expression: str) -> object:
    """`expression` over django.conf.settings in a fresh process with none of CHANGES_DEFAULTS
    set (no database is opened: the settings are only read)."""
    env = {k: v for k, v in os.environ.items() if k not in CHANGES_DEFAULTS}
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PALISADE_ENV_FILE": "none",
        "SECRET_KEY": "readme-defaults-test-key-" + "k" * 40,
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import json; from django.conf import settings as s; print(json.dumps({expression}))",
        ],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_without_database_url_bin_run_uses_var_palisade_sqlite3_in_wal_with_immediate_writes():
    """README: "without DATABASE_URL it runs on an embedded SQLite file (var/palisade.sqlite3,
    WAL, IMMEDIATE transactions)"."""
    db = settings_as_bin_run_reads_them(
        "{k: str(v) for k, v in s.DATABASES['default'].items() if k in ('ENGINE', 'NAME')}"
        " | s.DATABASES['default']['OPTIONS']"
    )
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["NAME"] == str(PROJECT_DIR / "var" / "palisade.sqlite3")
    assert "PRAGMA journal_mode=WAL" in db["init_command"]
    assert db["transaction_mode"] == "IMMEDIATE"


def test_an_attempt_without_a_timeout_of_its_own_gets_q_timeouts_1800_seconds():
    """README: "`@handler(..., timeout=60)` (else `Q_TIMEOUT`, 1800 s)"."""
    assert settings_as_bin_run_reads_them("s.Q_CLUSTER['timeout']") == 1800


def test_a_viewers_websockets_are_bounded_as_the_readme_says():
    """README: "10 per user and process, 5 messages a second"; "refuses messages over 64 KiB".
    tests/dashboard/test_socket_access.py and tests/acceptance/test_websocket_server.py prove
    each bound is enforced, at whatever value these constants hold."""
    assert consumers.MAX_SOCKETS_PER_USER == 10
    assert consumers.MESSAGES_PER_SECOND == 5
    assert websocket.MAX_MESSAGE_BYTES == 64 * 1024
