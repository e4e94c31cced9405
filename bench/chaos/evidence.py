"""The checks that read more than the database: every rejected write recorded exactly once (log
line = table row = metric delta), the unknown-outcome final writes and how each ended, the
intents by receiver lane, and the targeted faults' outcomes.

Rejections. The platform writes a rejection's row, commits, then logs it (logger
`jobs.fencing`, message `stale <write> rejected: job=<id> ... attempt_presented=<n> ...`;
jobs/core/transitions/fence.py and jobs/effects/fenced.py). The clusters log one JSON object a
line, each written with one write(2) to a file opened for appending (bench/chaos/clusters.py), so
no line is torn or buffered. What the design promises, and what is checked:
- every log line has its row (a line is only written after its row committed): lines without
  a row must be zero;
- every row has its line, except when the process that wrote it was SIGKILLed between the
  commit and the write(2) -- such rows are counted (`rejection_lines_lost_to_sigkill`) only
  when the row's worker is a pid the suite SIGKILLed; any other row without a line is a
  violation;
- the Prometheus counter `jobs_stale_writes_rejected_total` (summed over `write`), read through
  the metrics collector at the start and the end of the run (and scraped every SCRAPE_SECONDS
  in between, so its incremental tally runs under the faults), moved by exactly the number of
  rows.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.chaos.clusters import worker_pid

REJECTION = re.compile(r"^stale (\S+) rejected: job=(\d+) .*?attempt_presented=(\d+)")
UNKNOWN = re.compile(r"job (\d+) attempt (\d+)")
LANDED = re.compile(r"^job (\d+) attempt (\d+): the write had landed")
METRIC = re.compile(r'^jobs_stale_writes_rejected_total\{write="([^"]+)"\} ([0-9.e+]+)$')
SCRAPE_SECONDS = 2.0


def json_lines(logs: list[Path]) -> list[dict[str, Any]]:
    out = []
    for log in logs:
        if not log.exists():
            continue
        with open(log, errors="replace") as f:
            for line in f:
                if line.startswith("{") and line.endswith("\n"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue
    return out


def rejected_metric() -> float:
    """jobs_stale_writes_rejected_total summed over its labels, from this process's collector."""
    from jobs.ops.metrics import render

    out = render()
    text = out.decode() if isinstance(out, bytes) else str(out)
    return sum(float(m.group(2)) for line in text.splitlines() if (m := METRIC.match(line)))


class Scraper:
    """Scrapes the metrics every SCRAPE_SECONDS on a thread of its own, as Prometheus would."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.scrapes = 0
        self.errors = 0
        self.thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        from django.db import connection

        while not self.stop.wait(SCRAPE_SECONDS):
            try:
                rejected_metric()
                self.scrapes += 1
            except Exception:  # noqa: BLE001 - the database may be down (a pg_crash)
                self.errors += 1
                connection.close()
        connection.close()

    def __enter__(self) -> Scraper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def rejections(lines: list[dict[str, Any]], rows: list[tuple[int, int, str, str]],
               killed: set[int], metric_delta: float | None, zero: dict[str, list[Any]],
               info: dict[str, Any]) -> None:  # fmt: skip
    logged: Counter[tuple[int, int, str]] = Counter()
    for line in lines:
        if line.get("logger") == "jobs.fencing" and (m := REJECTION.match(line["message"])):
            logged[(int(m.group(2)), int(m.group(3)), m.group(1))] += 1
    stored: Counter[tuple[int, int, str]] = Counter()
    workers: dict[tuple[int, int, str], list[str]] = defaultdict(list)
    for job, attempt, write, worker in rows:
        stored[(job, attempt, write)] += 1
        workers[(job, attempt, write)].append(worker)
    zero["rejection_log_line_without_row"] = list((logged - stored).items())
    lost, missing = 0, []
    for key, n in (stored - logged).items():
        if any(worker_pid(w) in killed for w in workers[key]):
            lost += n
        else:
            missing.append((key, n))
    zero["rejection_row_without_log_line"] = missing
    if metric_delta is None or int(metric_delta) != len(rows):
        zero["rejection_metric_delta_not_row_count"] = [(metric_delta, len(rows))]
    info.update(
        rejection_rows=len(rows),
        rejection_log_lines=sum(logged.values()),
        rejection_metric_delta=metric_delta,
        rejection_lines_lost_to_sigkill=lost,
    )


def unknown_outcomes(lines: list[dict[str, Any]], outcomes: dict[tuple[int, int], str],
                     log: list[dict[str, Any]], info: dict[str, Any]) -> None:  # fmt: skip
    """Final writes whose outcome a worker did not hear, and how each was resolved: by the
    worker (re-read: it had landed; or presented again and decided), or -- its worker killed
    or its write a stale commit the nemesis held -- by the database alone."""
    heard: set[tuple[int, int]] = set()
    landed: set[tuple[int, int]] = set()
    for line in lines:
        message = line.get("message", "")
        if line.get("logger") == "jobs.completer":
            if message.startswith("connection lost during the final write"):
                heard.update((int(j), int(a)) for j, a in UNKNOWN.findall(message))
            elif m := LANDED.match(message):
                landed.add((int(m.group(1)), int(m.group(2))))
    resolution: Counter[str] = Counter()
    for key in heard:
        how = "re-read: had landed" if key in landed else "presented again"
        resolution[f"{how} -> attempt {outcomes.get(key, 'gone')}"] += 1
    targeted: Counter[str] = Counter()
    for fault in log:
        if fault.get("fired") and "job" in fault:
            key = (fault["job"], fault["attempt"])
            targeted[f"{fault['kind']} -> attempt {outcomes.get(key, 'gone')}"] += 1
    info.update(
        unknown_outcome_final_writes=len(heard),
        unknown_outcome_resolution=dict(sorted(resolution.items())),
        targeted_faults_resolution=dict(sorted(targeted.items())),
    )


def lanes(intents: list[tuple[str, str, float | None, bool, bool, int]],
          receivers: dict[str, str], info: dict[str, Any]) -> None:  # fmt: skip
    """Per receiver lane: intents by state and the commit-to-done delay (p50/p99/max), and the
    longest delay of an intent done on its first claim (a lane held up by another lane's
    hanging calls would show here; a claim lost with a killed relay waits out its lease)."""
    by_lane: dict[str, dict[str, Any]] = {}
    for url, state, seconds, unknown, reconciled, claims in intents:
        lane = next((name for name, base in receivers.items() if url.startswith(base)), "other")
        entry = by_lane.setdefault(lane, {"states": Counter(), "delays": [], "outcome_unknown": 0,
                                          "reconciled": 0})  # fmt: skip
        entry["states"][state] += 1
        entry["outcome_unknown"] += bool(unknown)
        entry["reconciled"] += bool(reconciled)
        if seconds is not None:
            entry["delays"].append(seconds)
            if claims == 1:
                entry["first_claim_max"] = max(entry.get("first_claim_max", 0.0), seconds)
    out = {}
    for lane, e in sorted(by_lane.items()):
        d = sorted(e["delays"])
        out[lane] = {"states": dict(e["states"]), "outcome_unknown": e["outcome_unknown"],
                     "reconciled": e["reconciled"], "done_after_commit_p50_s": pct(d, 0.5),
                     "done_after_commit_p99_s": pct(d, 0.99),
                     "done_after_commit_max_s": round(d[-1], 3) if d else None,
                     "done_on_first_claim_max_s": round(e.get("first_claim_max", 0.0), 3),
                     }  # fmt: skip
    info["intents_by_lane"] = out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)
