"""A PgBouncer of the suite's own, in transaction pooling, in front of the private PostgreSQL.

Owns: its config in a folder of its own (owned by `postgres` when run as root: pgbouncer
refuses root), start, kill -9 and start again on the same port (the `pooler_restart` fault).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from bench.chaos.pgserver import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(PGBOUNCER).exists()


class PrivatePgBouncer:
    def __init__(self, upstream_port: int, database: str) -> None:
        self.port = free_port()
        self.database = database
        self.work = Path(tempfile.mkdtemp(prefix="palisade-chaos-pgbouncer-"))
        (self.work / "users.txt").write_text('"postgres" ""\n')
        (self.work / "pgbouncer.ini").write_text(
            f"[databases]\n{database} = host=127.0.0.1 port={upstream_port} dbname={database}\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir =\nauth_type = trust\nauth_file = {self.work / 'users.txt'}\n"
            "pool_mode = transaction\ndefault_pool_size = 6\nmax_client_conn = 200\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.work / 'pgbouncer.log'}\n"
        )
        if os.geteuid() == 0:
            for path in (self.work, *self.work.iterdir()):
                shutil.chown(path, "postgres")
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    def start(self, timeout: float = 15.0) -> None:
        cmd = [PGBOUNCER, str(self.work / "pgbouncer.ini")]
        if os.geteuid() == 0:
            cmd[1:1] = ["-u", "postgres"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=1) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def restart(self) -> float:
        """kill -9 and start again on the same port; seconds until it answers."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        started = time.monotonic()
        self.start()
        self.restarts += 1
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.work, ignore_errors=True)
