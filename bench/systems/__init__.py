"""The systems bench/run.py measures: one module per system, all on bench/protocol.py.

Each system is a class with `label`, `key`, and `measure(ctx) -> dict` that returns at least
`jobs_per_s` (drain), and where it applies `enqueue` (single/bulk per second), `latency`
(idle enqueue -> start, ms) and `peak_rss` (MB). `setup(ctx)` runs once per benchmark run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.protocol import LOG_DIR, gaps


@dataclass
class Context:
    args: argparse.Namespace
    server: str  # postgres://user@host:port, no database
    rep: int = 1
    versions: dict[str, Any] = field(default_factory=dict)

    def log(self, name: str) -> Path:
        path = LOG_DIR / f"{name}-{self.rep}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        return path

    def latency_gaps(self) -> list[float]:
        a = self.args
        return gaps(a.seed + self.rep, a.latency_samples, a.gap_min, a.gap_max)

    def dsn(self, database: str) -> str:
        return f"{self.server}/{database}"


def recreate_database(server: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")


def palisade_database(server: str, name: str, **env_extra: str) -> dict[str, str]:
    """Recreate `name`, migrate Palisade into it, point this process's Django at it (set up
    once) and return the environment for the processes the benchmark starts."""
    import os
    import subprocess
    import sys

    from bench.protocol import ROOT

    recreate_database(server, name)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"{server}/{name}",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        **env_extra,
    }
    env.pop("REDIS_URL", None)  # about the database alone
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT, env=env, check=True, timeout=300,
    )  # fmt: skip
    os.environ.update({k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")})
    os.environ.pop("REDIS_URL", None)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    return env


def write_report(
    path: Path, started: Any, load_start: str, args: argparse.Namespace, **fields: Any
) -> None:
    """The JSON every benchmark writes: when, on what machine and load, with which arguments."""
    import json
    import os

    from bench.protocol import uptime

    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "started_at": started.isoformat(),
        "machine": {"cpus": os.cpu_count(), "uptime_start": load_start, "uptime_end": uptime()},
        "args": {k: str(v) for k, v in vars(args).items()},
        **fields,
    }
    path.write_text(json.dumps(report, indent=2, default=str))
    print(f"results: {path}")
