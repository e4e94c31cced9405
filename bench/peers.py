"""Virtual environments for the peers: installed from the package index, cached, never vendored.

Each peer gets its own venv under ~/.cache/palisade-bench/venvs/<name>-<hash of its pins and the
Python version> (BENCH_VENV_DIR overrides the root), created on first use with the Python running
the benchmark, and reused while its pins do not change. The pins are the versions measured; bump
them here to measure a newer release.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

PINS: dict[str, list[str]] = {
    "celery": ["celery[redis]==5.7.0"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]"],
    "django-tasks-db": ["django-tasks-db==0.13.0", "Django>=6.0,<6.2", "psycopg[binary]"],
    "django-q2-redis": ["django-q2==1.11.1", "redis", "Django>=6.0,<6.2", "psycopg[binary]"],
}

VENV_ROOT = Path(
    os.environ.get("BENCH_VENV_DIR", Path.home() / ".cache" / "palisade-bench" / "venvs")
)


def venv_python(name: str) -> Path:
    """The python of `name`'s venv, creating and installing it if missing or outdated."""
    pins = PINS[name]
    tag = hashlib.sha256(json.dumps([sys.version, pins]).encode()).hexdigest()[:10]
    venv = VENV_ROOT / f"{name}-{tag}"
    python = venv / "bin" / "python"
    stamp = venv / ".bench-installed"
    if stamp.exists() and python.exists():
        return python
    print(f"  installing {name} ({' '.join(pins)}) into {venv} ...", flush=True)
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins],
        check=True,
    )
    stamp.write_text("\n".join(pins) + "\n")
    return python


def versions(name: str) -> dict[str, str]:
    """Installed versions of the pinned distributions (for the JSON report)."""
    python = venv_python(name)
    dists = [p.split("[")[0].split("=")[0].split(">")[0].split("<")[0] for p in PINS[name]]
    code = (
        "import json, importlib.metadata as m, sys; "
        f"print(json.dumps({{d: m.version(d) for d in {dists!r}}}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)
