"""`bin/setup` creates `.venv` only with Python 3.12 or newer (Django 6): where the only
interpreter on the PATH is older, it stops with the README's clear message and creates nothing;
a `.venv` an older Python made earlier is kept as it is."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_DIR = Path(__file__).resolve().parents[2]

# What an older python3 does with bin/setup's check (`sys.exit(sys.version_info < (3, 12))`).
OLD_PYTHON = """#!/bin/sh
if [ "$1" = --version ]; then echo "Python 3.11.9"; exit 0; fi
exit 1
"""


def test_bin_setup_refuses_an_older_python_with_a_clear_message(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "bin").mkdir(parents=True)
    for path in ("bin/setup", "pyproject.toml"):
        shutil.copy2(PROJECT_DIR / path, root / path)
    tools = tmp_path / "path"  # the PATH: the script's own tools and an old python3, nothing else
    tools.mkdir()
    for tool in ("dirname",):
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    (tools / "python3").write_text(OLD_PYTHON)
    (tools / "python3").chmod(0o755)
    bash = shutil.which("bash") or "/bin/bash"
    done = subprocess.run(
        [bash, "bin/setup", "--dev"],
        cwd=root,
        env={"PATH": str(tools), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done.stdout
    assert "Palisade needs Python 3.12 or newer (Django 6); none found." in done.stderr
    assert not (root / ".venv").exists() and not (root / ".env").exists()


# An interpreter that writes each call's arguments to CALLS beside it, answering like Python
# VERSION (bin/setup's check: exit 1 when older than 3.12).
LOGGING_PYTHON = """#!/bin/sh
echo "$0 $*" >> "$(dirname "$0")/CALLS"
if [ "$1" = --version ]; then echo "Python VERSION"; exit 0; fi
if [ "$1" = -c ]; then exit OLD; fi
exit 0
"""


def logging_python(path: Path, version: str) -> None:
    old = "1" if tuple(map(int, version.split(".")[:2])) < (3, 12) else "0"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(LOGGING_PYTHON.replace("VERSION", version).replace("OLD", old))
    path.chmod(0o755)


def test_bin_setup_keeps_a_venv_an_older_python_made_earlier(tmp_path: Path) -> None:
    """README: "a `.venv` made earlier by an older Python is kept as it is (delete it to start
    again)": bin/setup neither replaces it nor asks the newer Python on the PATH for a new one;
    its install (pyproject.toml changed: no stamp yet) goes to that .venv's own interpreter."""
    root = tmp_path / "checkout"
    (root / "bin").mkdir(parents=True)
    for path in ("bin/setup", "pyproject.toml"):
        shutil.copy2(PROJECT_DIR / path, root / path)
    old = root / ".venv" / "bin" / "python"
    logging_python(old, "3.11.9")
    before = old.read_text()
    tools = tmp_path / "path"  # the script's own tools and a Python 3.12 it could have used
    for tool in ("dirname", "sha256sum", "cut", "cat"):
        tools.mkdir(exist_ok=True)
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    logging_python(tools / "python3.12", "3.12.8")
    bash = shutil.which("bash") or "/bin/bash"
    done = subprocess.run(
        [bash, "bin/setup"],
        cwd=root,
        env={"PATH": str(tools), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not (tools / "CALLS").exists(), (tools / "CALLS").read_text()  # never asked
    assert old.read_text() == before
    assert sorted(p.name for p in old.parent.iterdir()) == ["CALLS", "python"]
    install = ".venv/bin/python -m pip install --quiet -e .[dev]\n"
    assert (old.parent / "CALLS").read_text() == install


# An interpreter of VERSION that logs each call to CALLS beside it and answers bin/setup's
# version check as that version would: the check's own code runs, with sys.version_info set to
# VERSION. Its `-m venv` creates nothing, so bin/setup stops right after choosing it.
CHECKING_PYTHON = """#!/bin/sh
echo "$0 $*" >> "$(dirname "$0")/CALLS"
if [ "$1" = --version ]; then echo "Python VERSION"; exit 0; fi
if [ "$1" = -c ]; then
    exec REAL -c 'import sys; sys.version_info = INFO; exec(sys.argv[1])' "$2"
fi
exit 0
"""


@pytest.mark.parametrize(
    ("on_path", "chosen"),
    [
        ({"python3.12": "3.12.8", "python3.13": "3.13.1", "python3": "3.13.1"}, "python3.12"),
        ({"python3.13": "3.13.1", "python3": "3.12.3"}, "python3.13"),
        ({"python3": "3.12.3"}, "python3"),
        ({"python3": "3.11.9"}, None),
    ],
)
def test_bin_setup_creates_the_venv_with_the_first_of_its_pythons_that_is_new_enough(
    tmp_path: Path, on_path: dict[str, str], chosen: str | None
) -> None:
    """README: "the first of `python3.12`, `python3.13` and `python3` on the `PATH` that is 3.12
    or newer"."""
    root = tmp_path / "checkout"
    (root / "bin").mkdir(parents=True)
    for path in ("bin/setup", "pyproject.toml"):
        shutil.copy2(PROJECT_DIR / path, root / path)
    tools = tmp_path / "path"
    tools.mkdir()
    for tool in ("dirname",):
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    for name, version in on_path.items():
        info = "(" + ", ".join(version.split(".")) + ")"
        script = CHECKING_PYTHON.replace("VERSION", version).replace("INFO", info)
        (tools / name).write_text(script.replace("REAL", sys.executable))
        (tools / name).chmod(0o755)
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "bin/setup"],
        cwd=root,
        env={"PATH": str(tools), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = (tools / "CALLS").read_text().splitlines()
    venv = [call.split()[0].rsplit("/", 1)[1] for call in calls if " -m venv .venv" in call]
    if chosen is None:
        assert done.returncode != 0 and venv == []
        assert "Palisade needs Python 3.12 or newer (Django 6); none found." in done.stderr
    else:
        assert venv == [chosen], calls
