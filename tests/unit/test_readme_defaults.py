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
CHANGES_DEFAULTS = {
    "DATABASE_URL",
    "DJANGO_SETTINGS_MODULE",
    "DJANGO_DEBUG",
    "DJANGO_HTTPS",
    "DJANGO_HSTS_SECONDS",
    "ALLOWED_HOSTS",
    "PALISADE_SQLITE_PATH",
    "STATIC_ROOT",
    "MEDIA_ROOT",
    "DEMO_WEBHOOK_URL",
    "EMAIL_URL",
    "EMAIL_TIMEOUT",
    "DEFAULT_FROM_EMAIL",
    "PG_CONNECT_TIMEOUT",
    "REDIS_URL",
}
CHANGES_DEFAULTS_PREFIXES = ("JOBS_", "Q_", "LOGIN_")


def settings_as_bin_run_reads_them(expression: str, **given: str) -> object:
    """`expression` over django.conf.settings (`s`) and jobs_settings() (`j`) in a fresh process
    with none of CHANGES_DEFAULTS set but those `given` (no database is opened: the settings
    are only read)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CHANGES_DEFAULTS and not k.startswith(CHANGES_DEFAULTS_PREFIXES)
    }
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PALISADE_ENV_FILE": "none",
        "SECRET_KEY": "readme-defaults-test-key-" + "k" * 40,
        **given,
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, django; django.setup(); from django.conf import settings as s; "
            "from jobs.core.conf import jobs_settings; j = jobs_settings(); "
            f"print(json.dumps({expression}, default=str))",
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
    # docs/design.md, the embedded SQLite default: "WAL, `synchronous=NORMAL`"; writers queue
    # for the write lock with a "30 s busy timeout".
    assert "PRAGMA synchronous=NORMAL" in db["init_command"]
    assert db["timeout"] == 30


def test_an_attempt_without_a_timeout_of_its_own_gets_q_timeouts_1800_seconds():
    """README: "`@handler(..., timeout=60)` (else `Q_TIMEOUT`, 1800 s)"."""
    assert settings_as_bin_run_reads_them("s.Q_CLUSTER['timeout']") == 1800


def test_a_viewers_websockets_are_bounded_as_the_readme_says():
    """README: "10 per user and process, 5 messages a second"; "a pool of four threads of which
    one user's sockets take at most two"; "refuses messages over 64 KiB".
    tests/dashboard/test_socket_access.py and tests/acceptance/test_websocket_server.py prove
    each bound is enforced, at whatever value these constants hold."""
    assert consumers.MAX_SOCKETS_PER_USER == 10
    assert consumers.MESSAGES_PER_SECOND == 5
    assert consumers.POOL_THREADS == consumers._POOL._max_workers == 4
    assert consumers.USER_THREADS == 2
    assert websocket.MAX_MESSAGE_BYTES == 64 * 1024


# docs/operations.md's settings table: a row's first cell -> (its default cell, as written; the
# values the settings hold with none of the row's variables set). The page and the code are
# each held to these, so neither can drift from the other unseen.
SETTINGS_TABLE = {
    "`JOBS_WORKERS`": ("2", {"s.Q_CLUSTER['workers']": 2, "s.Q_CLUSTER['queue_limit']": 2}),
    "`JOBS_LEASE_SECONDS`": ("30", {"j.LEASE_SECONDS": 30}),
    "`JOBS_HEARTBEAT_SECONDS`": ("10", {"j.HEARTBEAT_SECONDS": 10}),
    "`JOBS_REAPER_SECONDS`": ("1", {"j.REAPER_SECONDS": 1}),
    "`JOBS_POLL_SECONDS`": ("0.5", {"j.POLL_SECONDS": 0.5}),
    "`JOBS_DRAIN_SECONDS`": ("10", {"j.DRAIN_SECONDS": 10}),
    "`JOBS_IDLE_WAIT_SECONDS`": ("10", {"j.IDLE_WAIT_SECONDS": 10}),
    "`JOBS_LISTEN_URL`": ("`DATABASE_URL`", {"j.LISTEN_URL": ""}),
    "`JOBS_CLAIM_BATCH`": ("64", {"j.CLAIM_BATCH": 64}),
    "`JOBS_PREPARED_STATEMENTS`": ("1", {"j.PREPARED_STATEMENTS": True}),
    "`JOBS_ENQUEUE_PREPARE`": ("`auto`", {"j.ENQUEUE_PREPARE": "auto"}),
    "`JOBS_STAGING_STORAGE`": ("`default`", {"j.STAGING_STORAGE": "default"}),
    "`JOBS_ORPHAN_GRACE_SECONDS`": ("3600", {"j.ORPHAN_GRACE_SECONDS": 3600}),
    "`JOBS_INTENT_RETRY_HOURS`": ("24", {"j.INTENT_RETRY_HOURS": 24}),
    "`JOBS_SHUTDOWN_GRACE_SECONDS`": ("20", {"j.SHUTDOWN_GRACE_SECONDS": 20}),
    "`JOBS_DB_TIMEOUT_SECONDS`": ("10", {"j.DB_TIMEOUT_SECONDS": 10}),
    "`JOBS_UNKNOWN_OUTCOME_SECONDS`": ("60", {"j.UNKNOWN_OUTCOME_SECONDS": 60}),
    "`JOBS_OUTAGE_LOG_SECONDS`, `JOBS_UNRESOLVED_DIR`": (
        "30, `var/unresolved`",
        {
            "j.OUTAGE_LOG_SECONDS": 30,
            "str(__import__('jobs.worker.unresolved').worker.unresolved.spool_dir()"
            ".relative_to(s.BASE_DIR))": "var/unresolved",
        },
    ),
    "`Q_TIMEOUT` / `Q_RETRY`": (
        "1800 / 1860",
        {"s.Q_CLUSTER['timeout']": 1800, "s.Q_CLUSTER['retry']": 1860},
    ),
    "`LOGIN_FAILURE_LIMIT`, `LOGIN_COOLOFF_MINUTES`, `LOGIN_LOCKOUT_BY`": (
        "5, 15, `username+ip_address`",
        {
            "s.AXES_FAILURE_LIMIT": 5,
            "s.AXES_COOLOFF_TIME.total_seconds()": 900,
            "s.AXES_LOCKOUT_PARAMETERS": [["username", "ip_address"]],
        },
    ),
    "`JOBS_LOG_FORMAT`": ("`text`", {"s.LOGGING['handlers']['console']['formatter']": "line"}),
    "`JOBS_LOG_LEVEL`": ("`INFO`", {"s.LOGGING['loggers']['jobs']['level']": "INFO"}),
    "`PALISADE_SQLITE_PATH`": (
        "`var/palisade.sqlite3`",
        {"str(s.DATABASES['default']['NAME'].relative_to(s.BASE_DIR))": "var/palisade.sqlite3"},
    ),
    "`STATIC_ROOT`, `MEDIA_ROOT`": (
        "`var/staticfiles`, `var/media`",
        {
            "str(s.STATIC_ROOT.relative_to(s.BASE_DIR))": "var/staticfiles",
            "str(s.MEDIA_ROOT.relative_to(s.BASE_DIR))": "var/media",
        },
    ),
    "`Q_POLL`, `Q_LOG_LEVEL`": (
        "0.05, `WARNING`",
        {"s.Q_CLUSTER['poll']": 0.05, "s.Q_CLUSTER['log_level']": "WARNING"},
    ),
    "`DEMO_WEBHOOK_URL`": (
        "`http://127.0.0.1:8000/demo/hook/`",
        {"s.DEMO_WEBHOOK_URL": "http://127.0.0.1:8000/demo/hook/"},
    ),
}


def documented_defaults() -> dict[str, str]:
    """docs/operations.md's settings table: first cell -> last cell (the default)."""
    text = (PROJECT_DIR / "docs" / "operations.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            rows[cells[0]] = cells[-1]
    return rows


def test_the_settings_tables_defaults_are_the_ones_the_settings_hold():
    """docs/operations.md, "Settings": each default as the table writes it, and as it is."""
    documented = documented_defaults()
    assert {row: documented.get(row) for row in SETTINGS_TABLE} == {
        row: cell for row, (cell, _) in SETTINGS_TABLE.items()
    }
    expressions = [e for _, values in SETTINGS_TABLE.values() for e in values]
    held = settings_as_bin_run_reads_them("[" + ", ".join(expressions) + "]")
    expected = [v for _, values in SETTINGS_TABLE.values() for v in values.values()]
    assert dict(zip(expressions, held, strict=True)) == dict(
        zip(expressions, expected, strict=True)
    )


def test_postgresqls_connect_timeout_defaults_to_5_seconds():
    """docs/operations.md, "Settings": `PG_CONNECT_TIMEOUT` ... 5."""
    assert documented_defaults()["`PG_CONNECT_TIMEOUT`"] == "5"
    timeout = settings_as_bin_run_reads_them(
        "s.DATABASES['default']['OPTIONS']['connect_timeout']",
        DATABASE_URL="postgres://nobody@127.0.0.1:9/never-connected",
    )
    assert timeout == 5
