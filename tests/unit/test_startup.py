"""Start-up refuses the public development key: DEBUG off and no SECRET_KEY stops every entry
point with a clear message, as a new user or an operator would meet it (real subprocesses)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parents[2]


def run(
    args: list[str],
    tmp_path: Path,
    unset: frozenset[str] = frozenset({"SECRET_KEY", "DJANGO_DEBUG"}),
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """Run an entry point in a session of its own, the runner's `unset` variables taken out of
    its environment; a start that does not refuse (a qcluster that starts) is stopped with its
    whole process group after the deadline."""
    base = {k: v for k, v in os.environ.items() if k not in unset}
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=PROJECT_DIR,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": "",  # the embedded default, in a directory of this test's own
            "PALISADE_SQLITE_PATH": str(tmp_path / "db.sqlite3"),
            "PALISADE_ENV_FILE": "none",  # as production: never the checkout's development .env
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(
    "entry",
    [
        ["manage.py", "check"],
        ["manage.py", "qcluster"],
        ["-c", "import config.asgi"],
        ["-c", "import config.wsgi"],
    ],
    ids=["manage.py check", "qcluster", "asgi", "wsgi"],
)
def test_without_a_secret_key_and_debug_off_every_entry_point_refuses_to_start(tmp_path, entry):
    done = run(entry, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "SECRET_KEY is not set and DEBUG is off" in done.stderr
    assert "Traceback" not in done.stderr  # a message, not a crash


def test_with_a_secret_key_it_starts(tmp_path):
    done = run(["manage.py", "check"], tmp_path, SECRET_KEY="x" * 50)
    assert done.returncode == 0, done.stdout + done.stderr


def test_in_debug_the_development_key_is_used(tmp_path):
    done = run(["manage.py", "check"], tmp_path, DJANGO_DEBUG="1")
    assert done.returncode == 0, done.stdout + done.stderr
