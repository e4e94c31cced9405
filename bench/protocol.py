"""The measuring protocol shared by every system in bench/: child processes, clocks, statistics.

Every system is measured the same way (see bench/README.md):

- drain: N no-op jobs are inserted while no worker runs, then 2 worker processes start; the rate
  is N / (last durable completion - first start), both read from where the system records them;
- enqueue: N single enqueues (each its own call and commit), then N in one bulk call, timed by
  the wall clock of the process enqueueing;
- idle latency: with the workers running and idle, one job at a time, enqueue -> start;
- peak RSS: the largest VmHWM (peak resident set) of any process of the system's worker groups,
  read from /proc just before they are stopped.

Nothing here imports Django or Palisade: the peers run in their own virtual environments.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A measurement never reads a developer's .env (bin/setup --dev): DEBUG there logs every query.
os.environ.setdefault("PALISADE_ENV_FILE", "none")

# Palisade refuses to start without a SECRET_KEY when DEBUG is off; the benchmarks' processes
# (and the peers' Django projects) get a bench-only one unless one is set.
os.environ.setdefault("SECRET_KEY", "palisade-bench-only-not-secret")

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
LOG_DIR = RESULTS_DIR / "logs"


# --------------------------------------------------------------------------------------------
# child processes: always in their own process group, always stopped on the way out
# --------------------------------------------------------------------------------------------

_CHILDREN: list[subprocess.Popen[bytes]] = []


def spawn(
    cmd: list[str], env: dict[str, str], log_path: Path, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    log.close()
    _CHILDREN.append(proc)
    return proc


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the leader, then the group, then SIGKILL the group."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group id
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    if group_alive(pgid):
        _killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if group_alive(pgid):
        _killpg(pgid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


def stop_all() -> None:
    for proc in list(_CHILDREN):
        stop(proc, grace=5.0)


def run_json(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path = ROOT) -> Any:
    """Run a short command (a peer agent) and parse the JSON it prints last."""
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed nothing:\n{out.stderr[-4000:]}")
    return json.loads(lines[-1])


def group_peak_rss_mb(pgids: list[int]) -> dict[str, Any]:
    """Peak resident set (VmHWM) of every live process in the given process groups."""
    peaks: list[tuple[float, str]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            # pgrp is the 5th field; the command name (2nd) may contain spaces, so split after ')'
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) not in pgids:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks.append((int(line.split()[1]) / 1024, cmdline.strip()[:120]))
    if not peaks:
        return {"max_mb": float("nan"), "processes": 0}
    top = max(peaks)
    return {
        "max_mb": round(top[0], 1),
        "max_process": top[1],
        "processes": len(peaks),
        "all_mb": sorted(round(p[0], 1) for p in peaks),
    }


def wait_for(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    procs: list[subprocess.Popen[bytes]] = (),  # type: ignore[assignment]
    interval: float = 0.01,
) -> float:
    """Poll `check` until true; fail fast when a worker process exited. Returns monotonic now."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return time.monotonic()
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: a worker exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50": round(percentile(values, 0.50), 2),
        "p95": round(percentile(values, 0.95), 2),
        "p99": round(percentile(values, 0.99), 2),
        "max": round(max(values), 2),
        "min": round(min(values), 2),
        "mean": round(statistics.fmean(values), 2),
        "n": len(values),
    }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def drain_rates(n: int, first_start: Any, first_finish: Any, last_finish: Any) -> dict[str, Any]:
    """N over first start -> last completion, and the steady rate between the first and the
    last completion (excludes the first start's warm-up). Accepts datetimes or float seconds."""

    def secs(a: Any, b: Any) -> float:
        d = b - a
        return d.total_seconds() if hasattr(d, "total_seconds") else float(d)

    span = secs(first_start, last_finish)
    steady = secs(first_finish, last_finish)
    return {
        "jobs": n,
        "span_s": round(span, 4),
        "jobs_per_s": n / span,
        "steady_jobs_per_s": (n - 1) / steady if steady > 0 else float("nan"),
    }


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def gaps(seed: int, n: int, lo: float, hi: float) -> list[float]:
    """The pauses between idle-latency samples: the same seeded sequence for every system."""
    import random

    rng = random.Random(seed)
    return [rng.uniform(lo, hi) for _ in range(n)]
