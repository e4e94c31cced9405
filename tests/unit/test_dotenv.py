"""The local development `.env`: `bin/setup --dev` (run by bin/run and bin/test) writes one when
there is none, config/settings.py reads it, so commands typed by hand start in development with
nothing exported; a variable in the real environment always wins over the file; and without a
`.env` (production) no SECRET_KEY still means no start. Real subprocesses, as a user types them.
"""

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parents[2]
REFUSAL = "SECRET_KEY is not set and DEBUG is off"
KEY = "dotenv-test-key-" + "k" * 40
SHOW = (
    "from django.conf import settings as s; "
    "print('debug', s.DEBUG); print('key', s.SECRET_KEY); print('env_file', s.ENV_FILE)"
)
# What the test runner's own environment must not leak into a user's shell: pytest-django's
# settings module, the suite's SECRET_KEY and its PALISADE_ENV_FILE=none (tests/settings.py).
RUNNER_ONLY = {"DJANGO_SETTINGS_MODULE", "SECRET_KEY", "DJANGO_DEBUG", "PALISADE_ENV_FILE"}


def user_env(tmp_path: Path, **env: str) -> dict[str, str]:
    """A shell with nothing Palisade-specific exported, on an embedded SQLite file of its own."""
    return {
        **{k: v for k, v in os.environ.items() if k not in RUNNER_ONLY},
        "DATABASE_URL": "",
        "PALISADE_SQLITE_PATH": str(tmp_path / "db.sqlite3"),
        **env,
    }


def manage(checkout: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=checkout,
        env=user_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def shown(done: subprocess.CompletedProcess) -> dict[str, str]:
    assert done.returncode == 0, done.stdout + done.stderr
    pairs = (line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    return {name: value for name, value in pairs if name in {"debug", "key", "env_file"}}


def refused(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == 2 and REFUSAL in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the code (not of its .env) whose own `.env` each test writes or leaves out."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    shutil.copy2(PROJECT_DIR / "manage.py", copy)
    for name in ("config", "jobs", "demo", "dashboard", "templates", "static"):
        shutil.copytree(
            PROJECT_DIR / name, copy / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    return copy


def write_dotenv(path: Path, *lines: str) -> Path:
    path.write_text("# a local development .env\n" + "".join(f"{line}\n" for line in lines))
    return path


# (a) the checkout's .env (or the file PALISADE_ENV_FILE names) starts commands typed by hand


def test_with_the_checkouts_dotenv_commands_start_with_nothing_exported(checkout, tmp_path):
    dotenv = write_dotenv(checkout / ".env", "DJANGO_DEBUG=1", f"SECRET_KEY={KEY}")

    done = manage(checkout, tmp_path, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    done = manage(checkout, tmp_path, "shell", "-c", "print('ok')")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
    values = shown(manage(checkout, tmp_path, "shell", "-c", SHOW))
    assert values == {"debug": "True", "key": KEY, "env_file": str(dotenv)}


def test_palisade_env_file_names_another_file(tmp_path):
    """Run in the real checkout: the named file replaces whatever .env the checkout holds."""
    elsewhere = write_dotenv(tmp_path / "elsewhere.env", "DJANGO_DEBUG=1", f"SECRET_KEY={KEY}")
    values = shown(
        manage(PROJECT_DIR, tmp_path, "shell", "-c", SHOW, PALISADE_ENV_FILE=str(elsewhere))
    )
    assert values == {"debug": "True", "key": KEY, "env_file": str(elsewhere)}


def test_a_palisade_env_file_that_names_no_file_is_an_error(tmp_path):
    done = manage(PROJECT_DIR, tmp_path, "check", PALISADE_ENV_FILE=str(tmp_path / "missing.env"))
    assert done.returncode != 0
    assert "missing.env names no file" in done.stderr, done.stderr


# (b) no .env, no DJANGO_DEBUG: production stays strict


def test_without_a_dotenv_or_debug_commands_refuse_with_the_clear_message(checkout, tmp_path):
    assert not (checkout / ".env").exists()
    assert refused(manage(checkout, tmp_path, "check"))
    done = manage(checkout, tmp_path, "shell", "-c", "print('ok')")
    assert refused(done) and "ok" not in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("value", ["none", "NONE", ""])
def test_palisade_env_file_none_or_empty_reads_no_file(checkout, tmp_path, value):
    write_dotenv(checkout / ".env", "DJANGO_DEBUG=1", f"SECRET_KEY={KEY}")
    assert refused(manage(checkout, tmp_path, "check", PALISADE_ENV_FILE=value))


# (c) the real environment wins over the .env


def test_an_exported_debug_off_beats_the_dotenvs_debug_on(checkout, tmp_path):
    write_dotenv(checkout / ".env", "DJANGO_DEBUG=1")  # no key: debug would use the dev key
    assert manage(checkout, tmp_path, "check").returncode == 0  # the .env is read ...
    assert refused(manage(checkout, tmp_path, "check", DJANGO_DEBUG="0"))  # ... and overruled

    write_dotenv(checkout / ".env", "DJANGO_DEBUG=1", f"SECRET_KEY={KEY}")
    values = shown(manage(checkout, tmp_path, "shell", "-c", SHOW, DJANGO_DEBUG="0"))
    assert values["debug"] == "False" and values["key"] == KEY


def test_an_exported_secret_key_beats_the_dotenvs(checkout, tmp_path):
    write_dotenv(checkout / ".env", "DJANGO_DEBUG=1", f"SECRET_KEY={KEY}")
    exported = "exported-key-" + "e" * 40
    values = shown(manage(checkout, tmp_path, "shell", "-c", SHOW, SECRET_KEY=exported))
    assert values["key"] == exported and values["debug"] == "True"


# (d) bin/setup --dev writes the .env when missing, never overwrites one; .env is git-ignored


@pytest.fixture
def setup_copy(tmp_path: Path) -> Callable[[str], Path]:
    """A directory holding bin/setup, pyproject.toml and .gitignore, in a git repository, whose
    .venv is already installed (its python is this one and its stamp matches pyproject.toml), so
    bin/setup installs nothing and goes straight to the .env."""

    def make(name: str) -> Path:
        root = tmp_path / name
        (root / "bin").mkdir(parents=True)
        for path in ("bin/setup", "pyproject.toml", ".gitignore"):
            shutil.copy2(PROJECT_DIR / path, root / path)
        (root / ".venv" / "bin").mkdir(parents=True)
        (root / ".venv" / "bin" / "python").symlink_to(sys.executable)
        digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
        (root / ".venv" / ".palisade-installed").write_text(digest + "\n")
        subprocess.run(["git", "init", "-q", str(root)], check=True, timeout=30)
        return root

    return make


def bin_setup(root: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bin/setup", *args],
        cwd=root,
        env=user_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installing dependencies" not in done.stdout  # the test's .venv is not touched
    return done


def test_bin_setup_dev_writes_a_git_ignored_dotenv_that_starts_commands(setup_copy, tmp_path):
    root = setup_copy("one")
    bin_setup(root, tmp_path, "--dev")
    dotenv = root / ".env"
    text = dotenv.read_text()
    assert text.startswith("#") and "Production must not use it" in text, text
    assert re.search(r"^DJANGO_DEBUG=1$", text, re.M), text
    key = re.search(r"^SECRET_KEY=([A-Za-z0-9_-]{50,})$", text, re.M)
    assert key, text
    assert stat.S_IMODE(dotenv.stat().st_mode) == 0o600  # it holds a secret
    assert sorted(p.name for p in root.iterdir()) == [
        ".env",
        ".git",
        ".gitignore",
        ".venv",
        "bin",
        "pyproject.toml",
    ]
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=root, timeout=30)
    assert ignored.returncode == 0, ".env is not git-ignored"

    # The file it wrote is what a hand-typed command then starts with.
    values = shown(
        manage(PROJECT_DIR, tmp_path, "shell", "-c", SHOW, PALISADE_ENV_FILE=str(dotenv))
    )
    assert values["debug"] == "True" and values["key"] == key.group(1)

    other = setup_copy("two")  # every checkout gets a freshly generated key
    bin_setup(other, tmp_path, "--dev")
    assert (other / ".env").read_text() != text


def test_bin_setup_never_overwrites_an_existing_dotenv(setup_copy, tmp_path):
    root = setup_copy("written")
    bin_setup(root, tmp_path, "--dev")
    first = (root / ".env").read_text()
    bin_setup(root, tmp_path, "--dev")
    assert (root / ".env").read_text() == first  # the key stays: sessions survive a restart

    own = setup_copy("own")
    (own / ".env").write_text("DJANGO_DEBUG=0\n")
    bin_setup(own, tmp_path, "--dev")
    assert (own / ".env").read_text() == "DJANGO_DEBUG=0\n"


def test_plain_bin_setup_writes_no_dotenv(setup_copy, tmp_path):
    """Production runs plain `bin/setup` (README): it must never get a development .env."""
    root = setup_copy("production")
    bin_setup(root, tmp_path)
    assert not (root / ".env").exists()
    bin_setup(root, tmp_path, "--dev", PALISADE_ENV_FILE="none")  # settings read no .env
    assert not (root / ".env").exists()


@pytest.mark.parametrize("script", ["bin/run", "bin/test"])
def test_the_development_scripts_ask_for_the_dotenv(script):
    assert re.search(r"^bin/setup --dev$", (PROJECT_DIR / script).read_text(), re.M)
