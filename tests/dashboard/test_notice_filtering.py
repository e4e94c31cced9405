"""A change notice re-renders a screen only when it can change what that screen shows: a
jobs-list socket filtered to other jobs costs no query and no render; open overviews in one
process share one computation."""

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections

import jobs
from dashboard import broadcast, screens, selectors
from dashboard.consumers import LiveConsumer
from dashboard.live import tail
from jobs.core import transitions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest_asyncio.fixture(autouse=True)
async def stop_event_tail() -> Any:
    yield
    if tail.task is not None and not tail.task.done():
        tail.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tail.task
    await sync_to_async(connections.close_all)()


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[broadcast.Screen]:
    """Every screen broadcast.render_swaps is asked to render (the only place pushes query)."""
    seen: list[broadcast.Screen] = []
    real = broadcast.render_swaps

    def counting(screen: broadcast.Screen, pending: broadcast.Pending) -> list[broadcast.Swap]:
        seen.append(screen)
        return real(screen, pending)

    monkeypatch.setattr(broadcast, "render_swaps", counting)
    return seen


async def open_socket(user: User, **screen: str) -> WebsocketCommunicator:
    since = await sync_to_async(selectors.latest_event_id)()
    query = urlencode({**screen, "since": since})
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), f"/ws/live/?{query}")
    communicator.scope["user"] = user
    assert (await communicator.connect(timeout=5))[0]
    assert (await communicator.receive_json_from(timeout=5))["swaps"] == []  # nothing missed
    return communicator


async def push_covering(communicator: WebsocketCommunicator, event_id: int) -> dict[str, Any]:
    """The first push; it must already carry `event_id` (an earlier one fails the test). A
    lease update (the claimed job's countdown) may come before it: not a push."""
    message = await communicator.receive_json_from(timeout=10)
    while "swaps" not in message and "leases" in message:
        message = await communicator.receive_json_from(timeout=10)
    assert message["last_event_id"] >= event_id, f"pushed for an earlier change: {message}"
    return message


async def enqueue(kind: str) -> tuple[int, int]:
    job = await sync_to_async(jobs.enqueue)(kind, {})
    return job.pk, await sync_to_async(selectors.latest_event_id)()


async def test_a_notice_about_other_jobs_costs_a_filtered_list_no_render(
    operator: User, renders: list[broadcast.Screen]
) -> None:
    narrow = await open_socket(operator, page="jobs", query="kind=test.sleep")
    witness = await open_socket(operator, page="jobs", query="")
    _, other_event = await enqueue("test.echo")
    await push_covering(witness, other_event)  # the notice has reached this process's sockets
    wanted, wanted_event = await enqueue("test.sleep")
    message = await push_covering(narrow, wanted_event)
    assert f'data-job="{wanted}"' in message["swaps"][0]["html"]
    assert [s.query for s in renders if s.query] == ["kind=test.sleep"]  # rendered once, for it
    await narrow.disconnect()
    await witness.disconnect()


async def test_a_job_leaving_the_filter_still_redraws_the_page_that_shows_it(
    operator: User, renders: list[broadcast.Screen]
) -> None:
    shown, _ = await enqueue("test.echo")
    queued = await open_socket(operator, page="jobs", query="state=queued", ids=str(shown))
    await sync_to_async(transitions.claim)("host:1", limit=1, lease_seconds=30)
    claimed = await sync_to_async(selectors.latest_event_id)()
    message = await push_covering(queued, claimed)
    assert "No jobs match." in message["swaps"][0]["html"]  # it is running now: off the page
    await queued.disconnect()


async def test_the_in_process_decision_follows_each_filter() -> None:
    pending = broadcast.Pending()
    pending.add(
        {
            "type": "events.changed",
            "last_event_id": 1,
            "job_ids": [7],
            "rejected": False,
            "overflow": False,
            "facts": [(7, "mail", "default", "queued", 1_700_000_000.0)],
        }
    )

    def decided(query: str) -> bool | None:
        return broadcast.affects(broadcast.Screen(page="jobs", query=query), pending)

    assert decided("") is True
    assert decided("kind=mail&queue=default&state=queued") is True
    assert decided("kind=nope") is False
    assert decided("queue=nope") is False
    assert decided("state=failed") is False
    assert decided("until=2000-01-01") is False
    assert decided("since=2999-01-01") is False
    assert decided("q=order") is None  # a search: one query over the changed jobs decides
    assert broadcast.affects(broadcast.Screen(page="job", job=8), pending) is False
    assert broadcast.affects(broadcast.Screen(page="rejected"), pending) is False


async def test_open_overviews_in_one_process_share_one_computation(
    operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = selectors.overview

    def counting(*args: Any, **kwargs: Any) -> selectors.Overview:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(selectors, "overview", counting)
    monkeypatch.setattr(screens, "_overview_cache", None)
    monkeypatch.setattr(screens, "OVERVIEW_SHARED_SECONDS", 30.0)  # the test may run slowly
    overviews = [await open_socket(operator, page="overview") for _ in range(5)]
    _, event = await enqueue("test.echo")
    for communicator in overviews:
        message = await push_covering(communicator, event)
        assert message["swaps"][0]["id"] == "overview-stats"
    assert len(calls) == 1
    for communicator in overviews:
        await communicator.disconnect()


async def test_lease_updates_go_only_to_screens_that_show_the_job(operator: User) -> None:
    narrow = await open_socket(operator, page="jobs", query="kind=nope")
    showing = await open_socket(operator, page="jobs", query="", ids="41")
    layer = get_channel_layer()
    assert layer is not None
    for job in (40, 41):
        await layer.group_send(
            broadcast.GROUP, {"type": "leases.changed", "leases": [(job, "1000", "900")]}
        )
    everything = {
        "type": "events.changed",
        "last_event_id": 0,
        "job_ids": [],
        "rejected": False,
        "overflow": True,
        "facts": [],
    }
    await layer.group_send(broadcast.GROUP, everything)  # a push every screen makes
    assert (await showing.receive_json_from(timeout=10))["leases"] == [[41, "1000", "900"]]
    first = await narrow.receive_json_from(timeout=10)
    assert "leases" not in first and first["swaps"][0]["id"] == "jobs-table"
    await narrow.disconnect()
    await showing.disconnect()
