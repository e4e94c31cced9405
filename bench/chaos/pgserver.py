"""A PostgreSQL server of the suite's own, to crash and restart freely.

Owns: `initdb` into a temporary folder, a port and a socket folder of its own, `pg_ctl start`,
kill -9 of the postmaster (a crash: WAL replay on the next start), restart, and removal.

Never: touches the machine's shared cluster (another port, another data folder, another
socket folder). Runs the server as the `postgres` user when started as root (initdb refuses
root).

Hazards: fsync is off for speed. That is sound for the faults injected here (the server process
dies, the kernel keeps its page cache), not for a power cut, which the suite does not simulate.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    for folder in versions:
        if (folder / name).exists():
            return str(folder / name)
    raise RuntimeError(f"{name} not found (PostgreSQL server binaries)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """One PostgreSQL server in a temporary folder; `dsn(db)` to reach it over TCP."""

    def __init__(self, root: Path | None = None, port: int | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="palisade-chaos-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = port or free_port()
        self.restarts = 0
        self._as_root = os.geteuid() == 0

    def _run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        full = ["runuser", "-u", "postgres", "--", *cmd] if self._as_root else list(cmd)
        return subprocess.run(full, capture_output=True, text=True, check=check, timeout=120)

    def init(self) -> PrivatePostgres:
        self.sockets.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.sockets, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")  # fmt: skip
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.sockets}'\nfsync = off\n"
                "full_page_writes = off\nmax_connections = 200\nshared_buffers = 128MB\n"
                "log_min_messages = warning\n"
            )
        return self

    def start(self, timeout: float = 60.0) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                  "-t", str(int(timeout)), "start")  # fmt: skip

    def dsn(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def ready(self) -> bool:
        done = subprocess.run(
            [_bin("pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)], check=False
        )
        return done.returncode == 0

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def crash(self) -> None:
        """kill -9 the postmaster and every backend (what an OOM kill or a crashed host does)."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        subprocess.run(["pkill", "-9", "-P", str(pid)], check=False)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postmaster {pid} still alive 30 s after SIGKILL")

    def restart_after_crash(self) -> float:
        """Crash, start again (WAL replay); the seconds until it accepts connections."""
        self.crash()
        started = time.monotonic()
        self.start()
        self.restarts += 1
        return time.monotonic() - started

    def stop(self) -> None:
        if self.postmaster_pid() is not None:
            self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
                      check=False)  # fmt: skip

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
