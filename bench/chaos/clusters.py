"""The real `manage.py qcluster`s the suite runs against the private PostgreSQL.

Owns: starting a cluster in a process group of its own (optionally under Debian's `faketime`,
its clock skewed by minutes, or through a fault proxy), finding the worker process that runs a
given attempt, signalling only pids inside a group it started, and stopping every group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]

# Short leases so a stalled worker is reclaimed within seconds (heartbeat <= lease / 3).
FAST = {
    "JOBS_LEASE_SECONDS": "2",
    "JOBS_HEARTBEAT_SECONDS": "0.5",
    "JOBS_REAPER_SECONDS": "0.2",
    "JOBS_POLL_SECONDS": "0.2",
    "JOBS_DB_TIMEOUT_SECONDS": "5",
    "JOBS_SHUTDOWN_GRACE_SECONDS": "3",
    # One JSON object a line (the checker counts the rejection lines); stderr is unbuffered
    # (PYTHONUNBUFFERED), so each record is one write(2) to a file opened for appending.
    "JOBS_LOG_FORMAT": "json",
}


@dataclass
class Cluster:
    name: str
    database_url: str
    env: dict[str, str]
    log: Path
    skew: str = ""  # faketime offset, e.g. "+90s"; "" = the real clock
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _out: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        cmd = [sys.executable, "manage.py", "qcluster"]
        env = {**os.environ, **FAST, **self.env, "DATABASE_URL": self.database_url,
               "DJANGO_SETTINGS_MODULE": "bench.chaos.settings", "PYTHONPATH": str(ROOT),
               "PYTHONUNBUFFERED": "1"}  # fmt: skip
        if self.skew:  # the library itself, not the `faketime` wrapper: signals reach qcluster
            env.update(LD_PRELOAD=faketime_library(), FAKETIME=self.skew,
                       FAKETIME_DONT_RESET="1")  # fmt: skip
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.starts += 1

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def owns(self, pid: int) -> bool:
        try:
            return self.pgid is not None and os.getpgid(pid) == self.pgid
        except ProcessLookupError:
            return False

    def pids(self) -> list[int]:
        """Every live process of this cluster's group, in pid order."""
        from bench.chaos.proxy import group_pids

        return group_pids(self.pgid) if self.pgid is not None else []

    def signal_group(self, sig: int) -> None:
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass

    def terminate(self, grace: float = 15.0, killed: set[int] | None = None) -> float:
        """SIGTERM the main process; SIGKILL the group after `grace` (the pids it SIGKILLs are
        added to `killed`). Seconds it took."""
        if self.proc is None:
            return 0.0
        started = time.monotonic()
        pgid = self.proc.pid
        self.signal_group(signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self._kill_group(pgid, killed)
                self.proc.wait(10)
        self._kill_group(pgid, killed)  # whatever of the group outlived its main process
        if self._out:
            self._out.close()
        return time.monotonic() - started

    @staticmethod
    def _kill_group(pgid: int, killed: set[int] | None) -> None:
        from bench.chaos.proxy import group_pids

        if killed is not None:
            killed.update(group_pids(pgid))
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def faketime_library() -> str:
    """Debian's libfaketime (package faketime); the multi-threaded build."""
    for folder in Path("/usr/lib").glob("*/faketime"):
        for name in ("libfaketimeMT.so.1", "libfaketime.so.1"):
            if (folder / name).exists():
                return str(folder / name)
    raise RuntimeError("libfaketime not found: apt-get install faketime")


def worker_pid(worker: str) -> int | None:
    """The pid in an Attempt.worker identity "<host>:<pid>"."""
    try:
        return int(worker.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
