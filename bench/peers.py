"""Environments for the peers: installed from the package index or the npm registry, cached,
never vendored.

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

# Node peers: npm packages installed into ~/.cache/palisade-bench/node/<name>-<hash> (Node 20 is
# the machine's: the newest releases that support it).
NODE_PINS: dict[str, list[str]] = {
    "graphile-worker": ["graphile-worker@0.17.3", "pg@8.16.3"],
    "pg-boss": ["pg-boss@10.4.2"],
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


def node_modules(name: str) -> Path:
    """The node_modules folder of `name`'s npm install, installing it if missing or outdated."""
    pins = NODE_PINS[name]
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    tag = hashlib.sha256(json.dumps([node.stdout.strip(), pins]).encode()).hexdigest()[:10]
    folder = VENV_ROOT.parent / "node" / f"{name}-{tag}"
    stamp = folder / ".bench-installed"
    if stamp.exists():
        return folder / "node_modules"
    print(f"  installing {name} ({' '.join(pins)}) into {folder} ...", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text('{"private": true}\n')
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", *pins],
        cwd=folder, check=True,
    )  # fmt: skip
    stamp.write_text("\n".join(pins) + "\n")
    return folder / "node_modules"


def node_versions(name: str) -> dict[str, str]:
    """Installed versions of the pinned npm packages and of Node itself (for the JSON report)."""
    modules = node_modules(name)
    found = {
        "node": subprocess.run(
            ["node", "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
    }
    for pin in NODE_PINS[name]:
        package = pin.rsplit("@", 1)[0]
        meta = json.loads((modules / package / "package.json").read_text())
        found[package] = meta["version"]
    return found
