"""What the server's backends were doing, sampled: for a benchmark minute that went wrong.

`ActivitySampler` reads pg_stat_activity on a side connection every `every` seconds and keeps,
until `take()`, how often each (backend type, wait event) was seen among the backends running a
statement ("CPU" when a running backend waits on nothing), and the longest-running statements
seen. bench/soak.py records one summary per report row, so a minute whose latencies collapsed
shows what ran in it (a lock wait, an autovacuum, a long prune), and the oldest transaction
seen open (any state, idle in transaction too; autovacuum's left out) with its xmin's age.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg

ACTIVITY = """
SELECT backend_type, coalesce(wait_event_type || ':' || wait_event, 'CPU'),
       extract(epoch FROM clock_timestamp() - query_start)::float8, left(query, 160)
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND state = 'active'
"""
# The oldest open transaction (idle in one too) but autovacuum's: its snapshot holds back the
# horizon below which dead rows may be removed or marked dead in an index, so a claim walks them
# meanwhile. A VACUUM's own xmin holds nothing back (PostgreSQL leaves it out), so autovacuum
# workers are left out here; their runs show among the longest statements.
OLDEST = """
SELECT backend_type, state, extract(epoch FROM clock_timestamp() - xact_start)::float8,
       age(backend_xmin), left(query, 160)
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND xact_start IS NOT NULL
   AND backend_type <> 'autovacuum worker'
 ORDER BY xact_start LIMIT 1
"""
# The horizon itself: the oldest xmin of every backend, autovacuum's included (a lazy VACUUM's
# is left out by the server, but an ANALYZE -- autovacuum's too -- holds its snapshot's), with
# its holder; sampled each second so a slow second can be set beside it.
HORIZON = """
SELECT age(backend_xmin), backend_type, coalesce(wait_event_type || ':' || wait_event, 'CPU'),
       left(query, 160)
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid() AND backend_xmin IS NOT NULL
 ORDER BY age(backend_xmin) DESC LIMIT 1
"""
QUERY_CHARS = 160


class ActivitySampler(threading.Thread):
    """pg_stat_activity every `every` seconds; `take()` returns the summary since the last."""

    def __init__(self, dsn: str, every: float = 1.0, top: int = 8) -> None:
        super().__init__(daemon=True)
        self.dsn, self.every, self.top = dsn, every, top
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._samples = 0
        self._waits: Counter[str] = Counter()
        self._longest: dict[str, tuple[float, str]] = {}  # query -> (seconds, backend type)
        self._oldest: dict[str, Any] | None = None
        self._horizon: list[int | None] = []  # per sample: the oldest xmin's age (transactions)
        self._horizon_max: dict[str, Any] | None = None

    def take(self) -> dict[str, Any]:
        with self._lock:
            longest = sorted(self._longest.items(), key=lambda kv: kv[1][0], reverse=True)
            summary = {
                "samples": self._samples,
                "waits": dict(self._waits.most_common(self.top)),
                "longest": [
                    {"seconds": round(seconds, 2), "backend": backend, "query": query}
                    for query, (seconds, backend) in longest[:3]
                ],
                "oldest_xact": self._oldest,
                "horizon_age": self._horizon,
                "horizon_max": self._horizon_max,
            }
            self._reset()
        return summary

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stopping.wait(self.every):
                    found = conn.execute(ACTIVITY).fetchall()
                    oldest = conn.execute(OLDEST).fetchone()
                    horizon = conn.execute(HORIZON).fetchone()
                    with self._lock:
                        self._samples += 1
                        for backend, wait, seconds, query in found:
                            self._waits[f"{backend} {wait}"] += 1
                            text = " ".join((query or "").split())[:QUERY_CHARS]
                            if seconds is not None and seconds > self._longest.get(text, (0,))[0]:
                                self._longest[text] = (seconds, backend)
                        self._horizon.append(horizon[0] if horizon else None)
                        if horizon and (
                            self._horizon_max is None or horizon[0] > self._horizon_max["age"]
                        ):
                            age, backend, wait, query = horizon
                            self._horizon_max = {
                                "age": age,
                                "backend": backend,
                                "wait": wait,
                                "query": " ".join((query or "").split())[:QUERY_CHARS],
                            }
                        if oldest is not None and oldest[2] is not None:
                            backend, state, seconds, xmin_age, query = oldest
                            if self._oldest is None or seconds > self._oldest["seconds"]:
                                self._oldest = {
                                    "seconds": round(seconds, 2),
                                    "xmin_age": xmin_age,
                                    "state": state,
                                    "backend": backend,
                                    "query": " ".join((query or "").split())[:QUERY_CHARS],
                                }
        except BaseException as exc:  # noqa: BLE001 -- the main loop reports it and stops
            self.error = exc


def describe(summary: dict[str, Any]) -> str:
    """One line: the most seen waits and the longest statement."""
    waits = ", ".join(f"{k} {v}" for k, v in list(summary.get("waits", {}).items())[:4])
    longest = summary.get("longest") or []
    slow = f"; longest {longest[0]['seconds']:.1f} s: {longest[0]['query'][:80]}" if longest else ""
    oldest = summary.get("oldest_xact")
    xact = (
        f"; oldest transaction {oldest['seconds']:.1f} s ({oldest['state']}, {oldest['backend']},"
        f" xmin age {oldest['xmin_age']}): {oldest['query'][:80]}"
        if oldest
        else ""
    )
    held = summary.get("horizon_max")
    horizon = (
        f"; horizon held longest by {held['backend']} (xmin age {held['age']}, {held['wait']}):"
        f" {held['query'][:80]}"
        if held
        else ""
    )
    return f"activity ({summary.get('samples', 0)} samples): {waits or 'idle'}{slow}{xact}{horizon}"
