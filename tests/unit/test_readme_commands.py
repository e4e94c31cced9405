"""The README's test command, as it says it runs, and `.ci/run` running exactly it.

README, "Two commands": `bin/test` "installs, starts PostgreSQL (and Redis) if down, runs the
whole suite on it, the SQLite tier (tests/sqlite) on a file database in a temporary directory,
then the fault-injection suite"; "without arguments also runs `ruff check`, `mypy` and
`lint-imports`; it takes pytest arguments (`bin/test tests/unit -q`; a path under `tests/sqlite`
runs on SQLite). `.ci/run` runs exactly `bin/test`."

The real `bin/test` and `.ci/run` run in a copy of the checkout whose `.venv` programs,
`bin/setup` and system commands (pg_isready, pg_ctlcluster, redis, apt-get, ...) are stubs that
write down how they were called: what the scripts do, not what the suite finds.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parents[2]
CHAOS = "bench/chaos/run.py --jobs 300 --faults 30 --seconds 40 --clusters 3"
RECORD = """#!/usr/bin/env bash
# Write down this call: the program, its arguments, and where its database would be.
{{
  printf '%s' "{name}"; [ $# -gt 0 ] && printf ' %s' "$@"
  [ -n "${{PALISADE_SQLITE_PATH:-}}" ] && printf ' [sqlite in a temporary directory]'
  [ "{name}" = python ] && [ -z "${{PALISADE_SQLITE_PATH:-}}" ] && printf ' [%s]' "$DATABASE_URL"
  echo
}} >> "$CALLS"
{then}
"""
# Down at first, up once started: pg_isready and `redis-cli ping` fail until their start ran.
DOWN_UNTIL_STARTED = 'if [ -e "$CALLS.{service}" ]; then exit 0; else exit 1; fi'
STARTS = 'touch "$CALLS.{service}"'


def _stub(path: Path, name: str, then: str = "exit 0") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RECORD.format(name=name, then=then))
    path.chmod(0o755)


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the scripts with every program they call stubbed, and the environment."""
    root = tmp_path / "checkout"
    (root / "bin").mkdir(parents=True)
    (root / ".ci").mkdir()
    shutil.copy2(PROJECT_DIR / "bin" / "test", root / "bin" / "test")
    shutil.copy2(PROJECT_DIR / ".ci" / "run", root / ".ci" / "run")
    _stub(root / "bin" / "setup", "setup")
    for program in ("python", "ruff", "mypy", "lint-imports"):
        _stub(root / ".venv" / "bin" / program, program)
    system = tmp_path / "system"
    _stub(system / "pg_isready", "pg_isready", DOWN_UNTIL_STARTED.format(service="pg"))
    _stub(system / "pg_ctlcluster", "pg_ctlcluster", STARTS.format(service="pg"))
    _stub(system / "redis-cli", "redis-cli", DOWN_UNTIL_STARTED.format(service="redis"))
    _stub(system / "redis-server", "redis-server", STARTS.format(service="redis"))
    for program in ("chromium", "pgbouncer", "apt-get", "sleep"):
        _stub(system / program, program)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "PALISADE_SQLITE_PATH", "CHAOS_SEED"}
    }
    env |= {"PATH": f"{system}:{env['PATH']}", "CALLS": str(tmp_path / "calls"), "CHAOS_SEED": "7"}
    return root, env


def _run(checkout: tuple[Path, dict[str, str]], *command: str) -> list[str]:
    root, env = checkout
    done = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = Path(env["CALLS"]).read_text().splitlines()
    return [c for c in calls if not c.startswith(("pg_isready", "redis-cli", "sleep"))]


def test_bin_test_starts_postgresql_and_redis_lints_then_runs_every_tier_and_the_chaos_suite(
    checkout,
):
    calls = [
        re.sub(r"redirect \S* main", "redirect <version> main", c)
        for c in _run(checkout, "bin/test")
    ]
    assert calls == [
        "setup --dev",  # installs (bin/setup), and the development .env
        "pg_ctlcluster --skip-systemctl-redirect <version> main start",
        "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save  --appendonly no",
        "ruff check .",
        "mypy jobs config dashboard demo",
        "lint-imports",
        "python -m pytest --create-db [postgres://postgres@127.0.0.1:5432/palisade]",
        "python -m pytest --ds=tests.settings_sqlite --create-db tests/sqlite"
        " [sqlite in a temporary directory]",
        f"python {CHAOS} --seed 1 [postgres://postgres@127.0.0.1:5432/palisade]",
        f"python {CHAOS} --seed 7 [postgres://postgres@127.0.0.1:5432/palisade]",
    ]


def test_ci_runs_exactly_bin_test(checkout):
    ci = _run(checkout, ".ci/run")
    Path(checkout[1]["CALLS"]).unlink()
    for service in ("pg", "redis"):
        Path(f"{checkout[1]['CALLS']}.{service}").unlink()
    assert ci == _run(checkout, "bin/test")


def test_bin_test_with_pytest_arguments_runs_only_pytest_with_them(checkout):
    calls = _run(checkout, "bin/test", "tests/unit", "-q")
    assert not [c for c in calls if c.startswith(("ruff", "mypy", "lint-imports"))]
    assert [c for c in calls if c.startswith("python")] == [
        "python -m pytest --create-db tests/unit -q [postgres://postgres@127.0.0.1:5432/palisade]"
    ]


@pytest.mark.parametrize(
    "path",
    [
        "tests/sqlite",
        "tests/sqlite/test_clock.py",
        "tests/sqlite/test_clock.py::test_an_expired_lease_planted_in_the_past_is_in_the_past",
        "./tests/sqlite/test_clock.py",  # ran on PostgreSQL: pytest takes a path it is given
        "tests/../tests/sqlite/",
        "ABSOLUTE/tests/sqlite/test_clock.py",
    ],
)
def test_a_path_under_tests_sqlite_runs_on_sqlite(checkout, path):
    path = path.replace("ABSOLUTE", str(checkout[0]))
    calls = _run(checkout, "bin/test", "-q", path)
    assert [c for c in calls if c.startswith("python")] == [
        f"python -m pytest --ds=tests.settings_sqlite --create-db -q {path}"
        " [sqlite in a temporary directory]"
    ]


@pytest.mark.parametrize("path", ["tests/sqlite_notes.py", "tests/unit/sqlite", "-k=sqlite"])
def test_a_path_elsewhere_runs_on_postgresql(checkout, path):
    calls = _run(checkout, "bin/test", path)
    assert [c for c in calls if c.startswith("python")] == [
        f"python -m pytest --create-db {path} [postgres://postgres@127.0.0.1:5432/palisade]"
    ]


def test_an_exported_database_url_is_the_one_the_suite_runs_on(checkout):
    """README: bin/test reaches `postgres` on 127.0.0.1 without a password; "else export
    `DATABASE_URL`"."""
    root, env = checkout
    url = "postgres://palisade:secret@db.example:5433/ci"
    calls = _run((root, {**env, "DATABASE_URL": url}), "bin/test", "tests/unit")
    assert [c for c in calls if c.startswith("python")] == [
        f"python -m pytest --create-db tests/unit [{url}]"
    ]
