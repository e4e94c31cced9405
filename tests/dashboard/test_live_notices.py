"""With REDIS_URL the channel layer is shared by every ASGI process (channels-redis, as
config/settings.py sets it up): only the process holding the PostgreSQL advisory lock publishes
change notices, and the access signals reach sockets held by another process.

Two processes are stood for by two publishers in one: two event tails, each on a database
connection of its own, and two channel-layer instances, each with its own Redis connections (a
message between them goes through Redis). Skipped where no Redis answers (TEST_REDIS_URL, else
REDIS_URL, else 127.0.0.1:6379).
"""

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.contrib.auth.models import User
from django.db import connection, connections

import jobs
from dashboard import access, broadcast, live, selectors

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

REDIS_URL = (
    os.environ.get("TEST_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379"
)


def _redis_answers() -> bool:
    url = urlsplit(REDIS_URL)
    try:
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 6379), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def prefix(settings: Any) -> str:
    """The shared layer, as with REDIS_URL, under a prefix of this test's own."""
    if not _redis_answers():
        pytest.skip(f"no Redis at {REDIS_URL}")
    if connection.vendor != "postgresql":
        pytest.skip("the publisher's advisory lock is PostgreSQL's")
    name = f"palisade-test-{uuid.uuid4().hex[:12]}"
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": name},
        }
    }
    return name


class Listener:
    """A socket of another ASGI process: its own layer instance, joined to `group`."""

    def __init__(self, prefix: str) -> None:
        self.layer = RedisPubSubChannelLayer(hosts=[REDIS_URL], prefix=prefix)
        self.received: list[dict[str, Any]] = []
        self.task: asyncio.Task[None] | None = None

    async def join(self, group: str) -> None:
        channel = await self.layer.new_channel()
        await self.layer.group_add(group, channel)
        self.task = asyncio.get_running_loop().create_task(self._collect(channel))

    async def _collect(self, channel: str) -> None:
        # One receive at a time, never cut by a timeout: a cancelled receive unsubscribes.
        while True:
            self.received.append(await self.layer.receive(channel))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.layer.flush()


@pytest_asyncio.fixture
async def listener(prefix: str) -> AsyncIterator[Listener]:
    other = Listener(prefix)
    try:
        yield other
    finally:
        await other.close()
        await sync_to_async(connections.close_all)()


async def until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)  # poll interval of a deadline-bound wait


def _lock_holders() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid = 0 AND objid = %s",
            [live.PUBLISHER_LOCK],
        )
        return int(cur.fetchone()[0])


async def test_only_the_lock_holder_publishes_and_each_change_is_one_notice(
    listener: Listener,
) -> None:
    await listener.join(broadcast.GROUP)
    start = await sync_to_async(selectors.latest_event_id)()
    tails = [live.EventTail(), live.EventTail()]
    for tail in tails:
        tail.ensure_started(from_id=start)
    try:
        holders = sync_to_async(_lock_holders)
        deadline = time.monotonic() + 10
        while await holders() != 1:
            assert time.monotonic() < deadline, "no tail took the publisher's lock"
            await asyncio.sleep(0.01)  # poll interval of a deadline-bound wait

        def notices() -> list[list[int]]:
            return [m["job_ids"] for m in listener.received if m["type"] == "events.changed"]

        changed = []
        for _ in range(3):  # one change at a time: each must arrive as one notice, once
            job = await sync_to_async(jobs.enqueue)("test.echo")
            changed.append(job.pk)
            await until(lambda pk=job.pk: [pk] in notices(), f"a notice naming job {job.pk}")
        assert notices() == [[pk] for pk in changed]
        assert await holders() == 1
        # The other tail, refused the lock, has not even read the events.
        assert sorted(tail.last_id != start for tail in tails) == [False, True]
    finally:
        for tail in tails:
            assert tail.task is not None
            tail.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tail.task


async def test_an_access_change_reaches_a_socket_of_another_process(
    listener: Listener,
) -> None:
    user = await sync_to_async(User.objects.create_user)("viewer", password="pw")
    await listener.join(access.user_group(user.pk))

    def deactivate() -> None:
        user.is_active = False
        user.save()

    await sync_to_async(deactivate)()

    await until(
        lambda: {"type": "access.changed", "session": ""} in listener.received,
        "the other process's socket told to re-check",
    )
