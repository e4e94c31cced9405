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
