"""A socket's handshake and messages are the client's word: one that cannot be read, or is longer
than any browser sends, is refused (4400) before it is parsed or rendered, with nothing logged;
a path with no route is refused too; and the user's next socket opens as before."""

import json
import logging

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from config.asgi import application
from dashboard import consumers
from tests.dashboard.test_socket_access import (  # noqa: F401  (stop_event_tail: autouse)
    HOST,
    closed_before_any_push,
    logged_in,
    opened_on_job,
    socket,
    stop_event_tail,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def alarming(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "raw",
    [
        b"page=jobs&since=0&query=q%3D\xff",
        b"page=job&job=1\xed\xa0\x80",  # a surrogate, encoded as UTF-8 (which has none)
        b"page=jobs&since=0&query=" + b"x" * consumers.MAX_HANDSHAKE,
        b"page=jobs&since=0&query=" + b"%26" * 1_500,  # more fields than Django reads
        b"page=jobs&since=0" + b"&a=1" * consumers.MAX_FIELDS,
    ],
    ids=["not UTF-8", "a surrogate", "over-long", "too many fields", "too many of its own"],
)
async def test_a_handshake_whose_query_cannot_be_read_is_refused_and_nothing_is_logged(
    operator: User, raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the first two raised UnicodeDecodeError out of connect(), the fourth raised
    # TooManyFieldsSent rendering the catch-up push (a traceback each), the others were accepted.
    client = await sync_to_async(logged_in)(operator)
    communicator = socket(client, "")
    communicator.scope["query_string"] = raw
    with caplog.at_level(logging.INFO):
        assert await communicator.connect(timeout=5) == (False, consumers.BAD_MESSAGE)
    assert alarming(caplog) == []
    assert not consumers._OPEN.get(operator.pk)  # it holds no place among the user's sockets
    _, mine, _ = await opened_on_job(operator)
    await mine.disconnect()


@pytest.mark.parametrize(
    "screen",
    [
        {"page": "jobs", "query": "x" * consumers.MAX_MESSAGE},
        {"page": "jobs", "query": "&" * 1_500},
    ],
    ids=["over-long", "too many fields"],
)
async def test_a_message_longer_than_a_browser_sends_or_unreadable_closes_its_socket(
    operator: User, screen: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    # Before: the first was parsed whole on the event loop (and its query cut), the second
    # raised TooManyFieldsSent at the next change the screen could show.
    _, communicator, _ = await opened_on_job(operator)
    with caplog.at_level(logging.INFO):
        await communicator.send_to(text_data=json.dumps({"screen": screen}))
        assert await closed_before_any_push(communicator) == consumers.BAD_MESSAGE
    assert alarming(caplog) == []
    _, mine, _ = await opened_on_job(operator)
    await mine.disconnect()


@pytest.mark.parametrize("path", ["/ws/elsewhere/", "/ws/live", "/"])
async def test_a_socket_to_a_path_without_a_route_is_refused_and_nothing_is_logged(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: channels' router raised ValueError("No route found"): a traceback at ERROR in the
    # server's log for every such handshake, anyone's.
    headers = [(b"origin", f"http://{HOST}".encode()), (b"host", HOST.encode())]
    communicator = WebsocketCommunicator(application, path, headers=headers)
    with caplog.at_level(logging.INFO):
        connected, _ = await communicator.connect(timeout=5)
    assert not connected
    assert alarming(caplog) == []


async def test_a_list_filtered_at_a_far_utc_offset_is_pushed_and_nothing_is_logged(
    operator: User, caplog: pytest.LogCaptureFixture
) -> None:
    """A time at a UTC offset Python reads (up to 23:59) and PostgreSQL refuses (past 15:59):
    before, the catch-up push's query raised DataError -- the consumer ended with a traceback
    logged, and the browser reconnected into the same failure."""
    from urllib.parse import urlencode

    import jobs

    client = await sync_to_async(logged_in)(operator)
    job = await sync_to_async(jobs.enqueue)("test.echo")
    listed = urlencode({"since": "2000-01-01T00:00+23:00"})
    communicator = socket(client, urlencode({"page": "jobs", "query": listed, "since": "0"}))
    with caplog.at_level(logging.INFO):
        assert (await communicator.connect(timeout=5))[0]
        message = await communicator.receive_json_from(timeout=10)
    assert [s["id"] for s in message["swaps"]] == ["jobs-table"]
    assert f'id="job-row-{job.pk}"' in message["swaps"][0]["html"]
    assert alarming(caplog) == []
    await communicator.disconnect()
