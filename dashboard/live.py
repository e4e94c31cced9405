"""The event tail: turns committed job events into coalesced change notices, one per process.

Owns: one asyncio task per ASGI process, started lazily by the first websocket, that reads new
`jobs_jobevent` rows and publishes what changed (broadcast.ChangeNotice) to the channel-layer
group at most every COALESCE_SECONDS, plus lease/heartbeat updates of running jobs every
LEASE_POLL_SECONDS (heartbeats write no events). Never: writes, renders, or touches the workers.

How it learns: it polls the event table every POLL_SECONDS -- `id > last seen`, a range scan of
the primary key that reads nothing when nothing happened. The workers already write an event row
in the statement of every transition, so they pay nothing at all for the dashboard. (A
statement-level NOTIFY trigger was built and measured first: it cost the drain 7-20% at ~4,000
jobs/s, because PostgreSQL serialises the commits of notifying transactions on one global lock;
see docs/dashboard.md, "Live updates".) The table is the message, so a reconnecting browser
catches up from it too. Ids are assigned before commit, so a transaction holding a lower id can
commit after a higher one was read: ids skipped over are re-checked for GAP_SECONDS.

- PostgreSQL: a dedicated async psycopg connection (never Django's), re-opened after errors.
- SQLite: the same queries through the ORM in a thread (one writer at a time there, so ids
  become visible in order).
- With REDIS_URL (channels-redis, several ASGI processes share the group): only the process
  holding a PostgreSQL advisory lock publishes, so each change is one notice
  (tests/dashboard/test_live_notices.py). When the holder goes and another process takes the
  lock, that one's first notice may repeat changes already announced (screens re-render; nothing
  is lost).

Hazards: the task must survive database restarts (reconnect after a pause) and never block the
event loop.
"""

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import close_old_connections, connection
from django.utils import timezone

from dashboard import broadcast

logger = logging.getLogger("dashboard.live")

POLL_SECONDS = 0.1
COALESCE_SECONDS = 0.25
LEASE_POLL_SECONDS = 1.0
RECONNECT_SECONDS = 1.0
BATCH = 5_000
GAP_SECONDS = 30.0
PUBLISHER_LOCK = 0x5041_4C49  # pg advisory lock key: the one publisher when the layer is shared

# Two statements, never `id > %s OR id = ANY(...)`: PostgreSQL plans that OR as a filter over a
# walk of the whole primary key (seconds at millions of events), each range scan is a few pages.
EVENTS_SQL = "SELECT id, job_id, type FROM jobs_jobevent WHERE id > %s ORDER BY id LIMIT %s"
GAPS_SQL = "SELECT id, job_id, type FROM jobs_jobevent WHERE id = ANY(%s)"
# What a jobs-list screen needs to decide without a query whether a changed job can be on its
# filtered first page (broadcast.Fact): one primary-key probe per changed job, per notice.
FACTS_SQL = (
    "SELECT id, kind, queue, state, extract(epoch FROM created_at)::float8 FROM jobs_job "
    "WHERE id = ANY(%s)"
)
# Overlapping windows: a beat written (clock_timestamp) just before a read commits just after it;
# sending a lease twice is harmless, missing one leaves a countdown wrong until the next beat.
BEATS_SINCE_SQL = "SELECT clock_timestamp() - interval '2 seconds'"
LEASES_SQL = (
    "SELECT id, (extract(epoch FROM lease_expires_at) * 1000)::bigint, "
    "(extract(epoch FROM heartbeat_at) * 1000)::bigint FROM jobs_job "
    "WHERE state = 'running' AND heartbeat_at >= %s"
)


class EventTail:
    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.last_id: int | None = None
        self.gaps: dict[int, float] = {}  # skipped id -> monotonic time first skipped
        self.last_publish = 0.0
        self.beats_since: Any = None

    def ensure_started(self, from_id: int) -> None:
        """Start the tail if it is not running, reading events after `from_id` -- the newest id
        the starting consumer has already accounted for, so nothing falls between the two."""
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.last_id, self.gaps = from_id, {}  # a new event loop (a test, a reload): afresh
            self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                if connection.vendor == "postgresql":
                    await self._tail_postgresql()
                else:
                    await self._tail_polling()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001  (log, pause, reconnect: the tail must live on)
                logger.warning("event tail failed; reconnecting", exc_info=True)
                await asyncio.sleep(RECONNECT_SECONDS)

    # -- PostgreSQL ---------------------------------------------------------------------------

    async def _tail_postgresql(self) -> None:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
        async with conn:
            if self.last_id is None:
                self.last_id = await self._scalar(
                    conn, "SELECT COALESCE(max(id), 0) FROM jobs_jobevent"
                )
            self.beats_since = await self._scalar(conn, BEATS_SINCE_SQL)
            next_leases = 0.0
            while True:
                await asyncio.sleep(POLL_SECONDS)  # the tail's poll interval
                await self._coalesce()
                if await self._publisher(conn):
                    await self._read_events(conn)
                    if time.monotonic() >= next_leases:
                        await self._read_leases(conn)
                        next_leases = time.monotonic() + LEASE_POLL_SECONDS

    async def _scalar(self, conn: psycopg.AsyncConnection, sql: str) -> Any:
        cur = await conn.execute(sql)
        row = await cur.fetchone()
        return row[0] if row else None

    async def _publisher(self, conn: psycopg.AsyncConnection) -> bool:
        if isinstance(get_channel_layer(), InMemoryChannelLayer):
            return True  # the group lives in this process: every process publishes its own
        # Session-level and re-entrant: once this connection holds it, it keeps it.
        return bool(await self._scalar(conn, f"SELECT pg_try_advisory_lock({PUBLISHER_LOCK})"))

    async def _coalesce(self) -> None:
        wait = self.last_publish + COALESCE_SECONDS - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)  # coalescing window: one notice per window, never a flood

    async def _read_events(self, conn: psycopg.AsyncConnection) -> None:
        now = time.monotonic()
        self.gaps = {i: t for i, t in self.gaps.items() if now - t < GAP_SECONDS}
        cur = await conn.execute(EVENTS_SQL, [self.last_id, BATCH])
        rows = await cur.fetchall()
        if self.gaps:
            cur = await conn.execute(GAPS_SQL, [list(self.gaps)])
            rows += await cur.fetchall()
        facts: list[broadcast.Fact] = []
        if rows:
            cur = await conn.execute(FACTS_SQL, [_changed(rows)])
            facts = await cur.fetchall()
        self._handle(rows, now, facts)

    async def _read_leases(self, conn: psycopg.AsyncConnection) -> None:
        since, self.beats_since = (
            self.beats_since,
            await self._scalar(conn, "SELECT clock_timestamp()"),
        )
        cur = await conn.execute(LEASES_SQL, [since])
        rows = await cur.fetchall()
        if rows:
            leases = [(r[0], str(r[1] or ""), str(r[2] or "")) for r in rows[:500]]
            await broadcast.publish({"type": "leases.changed", "leases": leases})

    # -- SQLite (through the ORM, in a thread) -------------------------------------------------

    async def _tail_polling(self) -> None:
        read = sync_to_async(_read_events_orm, thread_sensitive=True)
        leases = sync_to_async(_read_leases_orm, thread_sensitive=True)
        facts = sync_to_async(_read_facts_orm, thread_sensitive=True)
        if self.last_id is None:
            self.last_id = (await read(None))[1]
        next_leases = 0.0
        while True:
            await asyncio.sleep(POLL_SECONDS)  # the tail's poll interval
            await self._coalesce()
            rows, _ = await read(self.last_id)
            self._handle(rows, time.monotonic(), await facts(_changed(rows)))
            if time.monotonic() >= next_leases:
                changed = await leases()
                if changed:
                    await broadcast.publish({"type": "leases.changed", "leases": changed})
                next_leases = time.monotonic() + LEASE_POLL_SECONDS

    # -- both --------------------------------------------------------------------------------

    def _handle(
        self,
        rows: list[tuple[int, int, str]],
        now: float,
        facts: list[broadcast.Fact] | None = None,
    ) -> None:
        if not rows:
            return
        assert self.last_id is not None
        seen = {r[0] for r in rows}
        for row_id in seen:
            self.gaps.pop(row_id, None)
        top = max(seen)
        for missing in range(self.last_id + 1, top):
            if missing not in seen and len(self.gaps) < 10_000:
                self.gaps[missing] = now
        self.last_id = max(self.last_id, top)
        job_ids = _changed(rows)
        notice: broadcast.ChangeNotice = {
            "type": "events.changed",
            "last_event_id": self.last_id,
            "job_ids": job_ids[: broadcast.MAX_JOB_IDS],
            "rejected": any(r[2] == "rejected" for r in rows),
            "overflow": len(job_ids) > broadcast.MAX_JOB_IDS or len(rows) >= BATCH,
            "facts": list(facts or []),
        }
        self.last_publish = time.monotonic()
        asyncio.get_running_loop().create_task(broadcast.publish(notice))


def _changed(rows: list[tuple[int, int, str]]) -> list[int]:
    """The jobs these events changed, each once, as many as a notice names."""
    return list(dict.fromkeys(r[1] for r in rows))[: broadcast.MAX_JOB_IDS + 1]


def _read_facts_orm(ids: list[int]) -> list[broadcast.Fact]:
    from jobs.models import Job

    rows = Job.objects.filter(pk__in=ids).values_list("id", "kind", "queue", "state", "created_at")
    return [(i, k, q, s, at.timestamp()) for i, k, q, s, at in rows] if ids else []


def _read_events_orm(after: int | None) -> tuple[list[tuple[int, int, str]], int]:
    from jobs.models import JobEvent

    close_old_connections()
    if after is None:
        return [], JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    rows = list(
        JobEvent.objects.filter(id__gt=after)
        .order_by("id")
        .values_list("id", "job_id", "type")[:BATCH]
    )
    return rows, rows[-1][0] if rows else after


def _read_leases_orm() -> list[tuple[int, str, str]]:
    """Running jobs that beat in the last two seconds (overlapping windows, as on PostgreSQL)."""
    from jobs.models import Job

    def ms(at: Any) -> str:
        return str(int(at.timestamp() * 1000)) if at else ""

    since = timezone.now() - timedelta(seconds=2)
    rows = Job.objects.running().filter(heartbeat_at__gte=since)
    return [
        (pk, ms(lease), ms(beat))
        for pk, lease, beat in rows.values_list("id", "lease_expires_at", "heartbeat_at")[:500]
    ]


tail = EventTail()
