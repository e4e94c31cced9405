"""The live websocket on PostgreSQL: refused without login, pushes partials after commit,
catches a reconnecting browser up, coalesces a burst into a few pushes, and shows a rejected
write on the open overview."""

import asyncio
import contextlib
import json
import re
import time
from typing import Any
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connection, connections

import jobs
from config.asgi import application
from dashboard import screens, selectors
from dashboard.consumers import LiveConsumer
from dashboard.live import tail
from jobs.core import transitions
from jobs.core.transitions import Fence

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest_asyncio.fixture(autouse=True)
async def stop_event_tail() -> Any:
    """The tail outlives a consumer by design; each test's event loop ends it (and its conn)."""
    yield
    if tail.task is not None and not tail.task.done():
        tail.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tail.task
    await sync_to_async(connections.close_all)()  # the consumers' thread keeps its connection


def live(user: User | None, query: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), f"/ws/live/?{query}")
    if user is not None:
        communicator.scope["user"] = user
    return communicator


async def receive_until(
    communicator: WebsocketCommunicator, predicate: Any, timeout: float = 10.0
) -> dict[str, Any]:
    """Messages until one satisfies `predicate`; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "no matching message before the deadline"
        message = await communicator.receive_json_from(timeout=left)
        if predicate(message):
            return message


def swapped(element_id: str) -> Any:
    return lambda m: any(s["id"] == element_id for s in m.get("swaps", []))


async def test_unauthenticated_websocket_is_refused() -> None:
    communicator = WebsocketCommunicator(
        application, "/ws/live/?page=jobs", headers=[(b"origin", b"http://localhost")]
    )
    connected, _ = await communicator.connect()
    assert not connected


async def test_websocket_of_a_user_without_the_view_permission_is_refused() -> None:
    user = await sync_to_async(User.objects.create_user)("nobody")
    connected, _ = await live(user, "page=jobs").connect()
    assert not connected


async def test_job_page_receives_its_partial_after_a_claim_commits(staff: User) -> None:
    job = await sync_to_async(jobs.enqueue)("test.echo", {"n": 1})
    since = await sync_to_async(selectors.latest_event_id)()
    communicator = live(staff, f"page=job&job={job.pk}&since={since}")
    assert (await communicator.connect())[0]
    await communicator.receive_json_from(timeout=5)  # hello: nothing missed
    await sync_to_async(transitions.claim)("host:1", limit=1, lease_seconds=30)
    message = await receive_until(communicator, swapped("job-live"))
    html = message["swaps"][0]["html"]
    assert 'id="job-live"' in html and "Running" in html
    await communicator.disconnect()


async def test_reconnecting_browser_catches_up_on_what_it_missed(operator: User) -> None:
    job = await sync_to_async(jobs.enqueue)("test.echo", {"n": 2})
    before = await sync_to_async(selectors.latest_event_id)()
    await sync_to_async(transitions.claim)("host:1", limit=1, lease_seconds=30)
    communicator = live(operator, f"page=job&job={job.pk}&since={before}")
    assert (await communicator.connect())[0]
    message = await communicator.receive_json_from(timeout=5)
    assert swapped("job-live")(message)
    assert message["last_event_id"] > before
    await communicator.disconnect()


async def test_a_jobs_screen_searching_json_no_payload_can_hold_connects_and_shows_none(
    operator: User,
) -> None:
    """A lone surrogate (JSON's "\\ud800") in the search: the catch-up push renders the list
    with no rows; before, psycopg could not encode the query and connect() raised."""
    await sync_to_async(jobs.enqueue)("test.echo", {"a": 1})
    for q in ('{"a": "\\ud800"}', '{"\\ud800": 1}'):
        query = urlencode({"page": "jobs", "query": urlencode({"q": q}), "since": "0"})
        communicator = live(operator, query)
        assert (await communicator.connect())[0]
        message = await receive_until(communicator, swapped("jobs-table"))
        table = next(s["html"] for s in message["swaps"] if s["id"] == "jobs-table")
        assert 'id="job-row-' not in table and "No jobs match." in table
        await communicator.disconnect()


async def test_a_jobs_screen_with_an_invalid_filter_is_pushed_no_rows(operator: User) -> None:
    """Before: the socket dropped an invalid filter, so its pushes listed every job."""
    await sync_to_async(jobs.enqueue)("test.echo", {"a": 1})
    query = urlencode({"page": "jobs", "query": urlencode({"q": "x" * 501}), "since": "0"})
    communicator = live(operator, query)
    assert (await communicator.connect())[0]
    message = await receive_until(communicator, swapped("jobs-table"))
    table = next(s["html"] for s in message["swaps"] if s["id"] == "jobs-table")
    assert 'id="job-row-' not in table and "at most 500 characters" in table
    await sync_to_async(jobs.enqueue)("test.echo", {"a": 2})  # nothing it shows can change
    assert await communicator.receive_nothing(timeout=1.0)
    await communicator.disconnect()


def _burst(job_id: int, statements: int, rows: int) -> None:
    with connection.cursor() as cur:
        for _ in range(statements):
            cur.execute(
                "INSERT INTO jobs_jobevent (job_id, attempt, type, worker, at, data) "
                "SELECT %s, 0, 'requeued', 'burst', clock_timestamp(), '{}' "
                "FROM generate_series(1, %s)",
                [job_id, rows],
            )


async def test_a_burst_of_events_is_coalesced_into_a_few_pushes(operator: User) -> None:
    job = await sync_to_async(jobs.enqueue)("test.echo", {"n": 3})
    since = await sync_to_async(selectors.latest_event_id)()
    communicator = live(operator, f"page=job&job={job.pk}&since={since}")
    assert (await communicator.connect())[0]
    await communicator.receive_json_from(timeout=5)
    started = time.monotonic()
    await sync_to_async(_burst)(job.pk, statements=300, rows=10)  # 3,000 events
    last = await sync_to_async(selectors.latest_event_id)()
    pushes = 0
    while True:
        message = await communicator.receive_json_from(timeout=10)
        pushes += 1
        if message["last_event_id"] >= last:
            break
    elapsed = time.monotonic() - started
    assert pushes <= elapsed / 0.25 + 2, f"{pushes} pushes in {elapsed:.2f}s"
    assert await communicator.receive_nothing(timeout=0.6)  # and then quiet
    await communicator.disconnect()


async def test_lease_updates_reach_the_workers_screen(operator: User) -> None:
    await sync_to_async(jobs.enqueue)("test.echo", {"n": 4})
    communicator = live(operator, "page=workers&since=0")
    assert (await communicator.connect())[0]
    await sync_to_async(transitions.claim)("host:1", limit=1, lease_seconds=30)
    message = await receive_until(communicator, lambda m: "leases" in m)
    assert json.dumps(message["leases"])
    await communicator.disconnect()


def _zombie_commit(job_id: int) -> None:
    """Attempt 1's late commit against a job now on attempt 2: refused and recorded."""
    with pytest.raises(jobs.LeaseLost):
        transitions.commit(Fence(job_id, 1, "host:101"), "stale")


def rejected_total(html: str) -> int:
    found = re.search(r'<span id="rejected-total">(\d+)</span>', html)
    assert found, html
    return int(found.group(1))


async def test_a_rejected_write_reaches_the_open_overview_live(
    operator: User, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: the rejection is "shown live on the dashboard (`/`)"."""
    monkeypatch.setattr(screens, "_overview_cache", None)  # no overview computed before it
    job = await sync_to_async(make_job)(state="running", attempt=2, worker="host:102")
    since = await sync_to_async(selectors.latest_event_id)()
    communicator = live(operator, f"page=overview&since={since}")
    assert (await communicator.connect())[0]
    assert (await communicator.receive_json_from(timeout=5))["swaps"] == []  # nothing missed
    await sync_to_async(_zombie_commit)(job.pk)
    rejected_event = await sync_to_async(selectors.latest_event_id)()
    message = await receive_until(
        communicator,
        lambda m: swapped("overview-stats")(m) and m["last_event_id"] >= rejected_event,
    )
    html = next(s["html"] for s in message["swaps"] if s["id"] == "overview-stats")
    assert rejected_total(html) == 1
    await communicator.disconnect()
