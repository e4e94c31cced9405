"""`bin/setup` creates `.venv` only with Python 3.12 or newer (Django 6): where the only
interpreter on the PATH is older, it stops with the README's clear message and creates nothing."""

import shutil
import subprocess
from pathlib import Path

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
