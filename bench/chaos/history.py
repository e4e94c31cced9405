"""The append-only history: one JSON line per action, written by handlers before and after each
outside call, and read by the checker.

Each line is written with one `write(2)` on a file opened with O_APPEND, so lines of concurrent
processes never interleave (a line is far below the size the kernel writes at once) and a
process killed mid-job leaves whole lines only. The file is CHAOS_HISTORY.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_fd: int | None = None


def _file() -> int:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["CHAOS_HISTORY"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return _fd


def record(job: int, attempt: int, action: str, phase: str, **fields: Any) -> None:
    line = {"t": time.time(), "pid": os.getpid(), "job": job, "attempt": attempt,
            "action": action, "phase": phase, **fields}  # fmt: skip
    os.write(_file(), (json.dumps(line, separators=(",", ":")) + "\n").encode())


def read(path: Path) -> Iterator[dict[str, Any]]:
    with open(path) as lines:
        for line in lines:
            if line.endswith("\n"):  # a torn last line (the writer killed mid-write) is skipped
                yield json.loads(line)
