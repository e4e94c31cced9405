"""A websocket lives no longer than its access: logout, deactivation, removal from `operators`
or a vanished session close it before it sends anything more, and it cannot re-point itself
afterwards; the handshake's Origin must be this site's scheme, host *and* port, and its Host an
allowed host."""

import asyncio
import contextlib
import threading
from datetime import timedelta
from importlib import import_module
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import jobs
from config.asgi import application
from dashboard import access, broadcast, consumers, selectors
from dashboard.live import tail
from jobs.core import transitions

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

HOST = "localhost"


@pytest_asyncio.fixture(autouse=True)
async def stop_event_tail() -> Any:
    yield
    if tail.task is not None and not tail.task.done():
        tail.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tail.task
    await sync_to_async(connections.close_all)()


def logged_in(user: User) -> Client:
    client = Client(HTTP_HOST=HOST)
    client.force_login(user)
    return client


def socket(client: Client | None, query: str, **headers: str) -> WebsocketCommunicator:
    """A browser's socket through the whole ASGI stack: origin check, cookie, session."""
    sent = {"origin": f"http://{HOST}", "host": HOST, **headers}
    if client is not None:
        sent["cookie"] = f"sessionid={client.cookies['sessionid'].value}"
    return WebsocketCommunicator(
        application,
        f"/ws/live/?{query}",
        headers=[(k.encode(), v.encode()) for k, v in sent.items()],
    )


async def opened_on_job(user: User) -> tuple[Client, WebsocketCommunicator, int]:
    """The user's browser with a job page open and its hello received."""
    client = await sync_to_async(logged_in)(user)
    job = await sync_to_async(jobs.enqueue)("test.echo", {"secret": "s3"})
    since = await sync_to_async(selectors.latest_event_id)()
    communicator = socket(client, f"page=job&job={job.pk}&since={since}")
    assert (await communicator.connect(timeout=5))[0]
    assert (await communicator.receive_json_from(timeout=5))["swaps"] == []
    return client, communicator, job.pk


async def closed_before_any_push(communicator: WebsocketCommunicator, timeout: float = 10) -> int:
    """The socket's next output is its close (code returned): no partial, no lease, no data."""
    output = await communicator.receive_output(timeout=timeout)
    assert output["type"] == "websocket.close", f"sent after access ended: {output}"
    return int(output.get("code", 0))


async def then_the_job_changes() -> list[int]:
    """The oldest due job is claimed (an event on it): the ids of the jobs claimed."""
    claimed = await sync_to_async(transitions.claim)("host:1", limit=1, lease_seconds=30)
    return [c.fence.job_id for c in claimed]


async def test_logout_closes_the_socket_before_it_pushes_again(operator: User) -> None:
    client, communicator, _ = await opened_on_job(operator)
    response = await sync_to_async(client.post)(reverse("dashboard:logout"))
    assert response.status_code == 302
    await then_the_job_changes()
    assert await closed_before_any_push(communicator) == 4403


async def test_deactivation_closes_the_socket(operator: User) -> None:
    _, communicator, _ = await opened_on_job(operator)
    operator.is_active = False
    await sync_to_async(operator.save)()
    await then_the_job_changes()
    assert await closed_before_any_push(communicator) == 4403


async def test_removal_from_operators_closes_the_socket(operator: User) -> None:
    _, communicator, _ = await opened_on_job(operator)
    group = await sync_to_async(Group.objects.get)(name="operators")
    await sync_to_async(operator.groups.remove)(group)
    await then_the_job_changes()
    assert await closed_before_any_push(communicator) == 4403


async def test_the_operators_group_losing_its_permission_closes_its_sockets(
    operator: User,
) -> None:
    _, communicator, _ = await opened_on_job(operator)
    group = await sync_to_async(Group.objects.get)(name="operators")
    await sync_to_async(group.permissions.clear)()
    await then_the_job_changes()
    assert await closed_before_any_push(communicator) == 4403


async def test_a_socket_whose_session_is_gone_cannot_re_point_itself(operator: User) -> None:
    """No signal here (the session row just vanishes, as an expired one does): the re-check
    before the first push after a message from the browser refuses the new screen and closes
    the socket."""
    client, communicator, _ = await opened_on_job(operator)
    other = await sync_to_async(jobs.enqueue)("test.echo", {"secret": "other"})
    key = client.cookies["sessionid"].value
    await sync_to_async(Session.objects.filter(session_key=key).delete)()
    await communicator.send_json_to({"screen": {"page": "job", "job": str(other.pk)}})
    await then_the_job_changes()
    assert await closed_before_any_push(communicator) == 4403


async def test_a_session_that_now_logs_in_someone_else_ends_the_socket(
    operator: User, staff: User
) -> None:
    """The socket belongs to the user its handshake logged in: its session row now logging in
    another user (who may see the dashboard too) is a session that no longer logs that user in."""
    client, communicator, job_id = await opened_on_job(operator)
    key = client.cookies["sessionid"].value

    def log_in_someone_else() -> None:
        store = import_module(django_settings.SESSION_ENGINE).SessionStore(session_key=key)
        store[SESSION_KEY] = str(staff.pk)
        store[HASH_SESSION_KEY] = staff.get_session_auth_hash()
        store.save()

    await sync_to_async(log_in_someone_else)()
    await communicator.send_json_to({"screen": {"page": "job", "job": str(job_id)}})
    await then_the_job_changes()
    assert await closed_before_any_push(communicator) == 4403


async def test_a_change_no_signal_announced_is_caught_before_the_next_push(
    operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queryset update sends no signal (another process without the channel layer, SQL by
    hand): the cached re-check before a push still finds it."""
    monkeypatch.setattr(access, "RECHECK_SECONDS", 0.0)
    _, communicator, _ = await opened_on_job(operator)
    await sync_to_async(User.objects.filter(pk=operator.pk).update)(is_active=False)
    await then_the_job_changes()
    assert await closed_before_any_push(communicator) == 4403


async def test_a_socket_that_keeps_its_access_keeps_receiving(operator: User) -> None:
    _, communicator, job_id = await opened_on_job(operator)
    await then_the_job_changes()
    message = await communicator.receive_json_from(timeout=10)
    if "swaps" not in message:  # the claimed job's lease countdown may come first
        assert set(message) == {"leases"}, message
        message = await communicator.receive_json_from(timeout=10)
    assert [s["id"] for s in message["swaps"]] == ["job-live"]
    await communicator.disconnect()


# -- Origin ------------------------------------------------------------------------------------


async def connects(client: Client, **headers: str) -> bool:
    communicator = socket(client, "page=overview&since=0", **headers)
    connected, _ = await communicator.connect(timeout=5)
    if connected:
        await communicator.disconnect()
    return connected


async def test_an_origin_on_another_port_is_refused(operator: User) -> None:
    client = await sync_to_async(logged_in)(operator)
    assert not await connects(client, origin=f"http://{HOST}:6666")
    assert not await connects(client, origin=f"https://{HOST}")  # another scheme
    assert not await connects(client, origin="http://evil.example")
    assert await connects(client)  # the site itself, as the browser reached it


async def test_the_port_of_the_host_is_part_of_the_origin(operator: User) -> None:
    client = await sync_to_async(logged_in)(operator)
    assert await connects(client, host=f"{HOST}:8000", origin=f"http://{HOST}:8000")
    assert not await connects(client, host=f"{HOST}:8000", origin=f"http://{HOST}")


async def test_a_host_outside_allowed_hosts_is_refused_even_when_the_origin_matches_it(
    operator: User, settings: Any
) -> None:
    """DNS rebinding: a page on rebound.example whose name now resolves to this server sends
    Origin and Host alike; only ALLOWED_HOSTS tells it from the site."""
    settings.ALLOWED_HOSTS = [HOST]
    client = await sync_to_async(logged_in)(operator)
    rebound = "rebound.example"
    assert not await connects(client, host=rebound, origin=f"http://{rebound}")
    assert not await connects(client, host=f"{rebound}:8000", origin=f"http://{rebound}:8000")
    assert await connects(client)  # the site itself, on an allowed host


async def test_behind_a_tls_proxy_the_https_origin_and_trusted_origins_are_accepted(
    operator: User, settings: Any
) -> None:
    settings.ALLOWED_HOSTS = ["ops.example.com"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com"]
    client = await sync_to_async(logged_in)(operator)
    proxied = {"host": "ops.example.com", "x-forwarded-proto": "https"}
    assert await connects(client, origin="https://ops.example.com", **proxied)
    assert await connects(client, origin="https://console.example.com", **proxied)
    assert not await connects(client, origin="http://ops.example.com", **proxied)
    assert not await connects(client, origin="https://ops.example.com:8443", **proxied)


async def test_a_wildcard_trusted_origin_is_read_as_djangos_csrf_check_reads_it(
    operator: User, settings: Any
) -> None:
    """`https://*.example.com` in CSRF_TRUSTED_ORIGINS: Django's CSRF check accepts a POST from
    any subdomain, and the socket refused them all (the entry was compared as one origin)."""
    settings.ALLOWED_HOSTS = ["ops.example.com"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.example.com"]
    client = await sync_to_async(logged_in)(operator)
    proxied = {"host": "ops.example.com", "x-forwarded-proto": "https"}
    assert await connects(client, origin="https://console.example.com", **proxied)
    assert await connects(client, origin="https://a.b.example.com", **proxied)
    assert not await connects(client, origin="http://console.example.com", **proxied)  # scheme
    assert not await connects(client, origin="https://console.example.com:8443", **proxied)
    assert not await connects(client, origin="https://evilexample.com", **proxied)
    assert not await connects(client, origin="https://example.com.evil", **proxied)


# -- a viewer's sockets cannot slow anyone else's ----------------------------------------------


async def test_a_socket_flooding_messages_is_closed_and_the_others_keep_receiving(
    operator: User,
) -> None:
    _, victim, _ = await opened_on_job(operator)
    _, flood, _ = await opened_on_job(operator)
    for _ in range(consumers.MESSAGES_BURST + 5):  # faster than any browser
        await flood.send_json_to({"screen": {"page": "jobs"}})
    # A push for a change made before the flood (the jobs enqueued above, whose notices a loaded
    # machine may deliver late, to the screen the first message asked for) may come first.
    output = await flood.receive_output(timeout=10)
    while output["type"] == "websocket.send":
        output = await flood.receive_output(timeout=10)
    assert (output["type"], output.get("code")) == ("websocket.close", consumers.TOO_MANY)
    await then_the_job_changes()
    message = await victim.receive_json_from(timeout=10)
    while "swaps" not in message:  # a lease countdown may come first
        message = await victim.receive_json_from(timeout=10)
    assert [s["id"] for s in message["swaps"]] == ["job-live"]
    await victim.disconnect()


@pytest.mark.parametrize(
    "sent",
    [
        {"text_data": "not json"},
        {"text_data": '"a string"'},
        {"text_data": '{"screen": "jobs"}'},
        {"text_data": '{"screen": ["jobs"]}'},
        {"text_data": "[" * 100_000 + "]" * 100_000},
        {"bytes_data": b"\x00\x01"},
    ],
    ids=["not JSON", "a string", "screen not an object", "screen a list", "deep", "binary"],
)
async def test_a_malformed_message_closes_its_socket_with_a_clear_code(
    operator: User, sent: dict[str, Any]
) -> None:
    # Before: each of these raised inside the consumer (close 1011, a traceback in the log).
    _, communicator, _ = await opened_on_job(operator)
    if "text_data" in sent:
        await communicator.send_to(text_data=sent["text_data"])
    else:
        await communicator.send_to(bytes_data=sent["bytes_data"])
    assert await closed_before_any_push(communicator) == consumers.BAD_MESSAGE


async def test_a_user_opens_a_bounded_number_of_sockets(operator: User) -> None:
    client = await sync_to_async(logged_in)(operator)
    opened = []
    for _ in range(consumers.MAX_SOCKETS_PER_USER):
        communicator = socket(client, "page=overview&since=0")
        assert (await communicator.connect(timeout=5))[0]
        opened.append(communicator)
    one_more = socket(client, "page=overview&since=0")
    connected, code = await one_more.connect(timeout=5)
    assert (connected, code) == (False, consumers.TOO_MANY)  # refused at the handshake
    await opened.pop().disconnect()
    again = socket(client, "page=overview&since=0")
    assert (await again.connect(timeout=5))[0]  # a place freed
    for communicator in [*opened, again]:
        await communicator.disconnect()


async def test_a_slow_render_on_one_socket_does_not_hold_up_another_sockets_work(
    operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sockets' queries and renders run on a pool of threads: before, on channels' one
    shared thread, the second socket could not even connect while the first one's render ran."""
    gate, entered, finished = threading.Event(), threading.Event(), threading.Event()
    real = broadcast.render_swaps

    def render(screen: broadcast.Screen, pending: Any) -> Any:
        if screen.page != "jobs":
            return real(screen, pending)
        entered.set()
        gate.wait(20)
        try:
            return real(screen, pending)
        finally:
            finished.set()

    monkeypatch.setattr(broadcast, "render_swaps", render)
    client = await sync_to_async(logged_in)(operator)
    # An event after since=0, so the slow socket has a catch-up render to make; on a job not due,
    # so the claim below changes the victim's job, not this one.
    later = timezone.now() + timedelta(hours=1)
    await sync_to_async(jobs.enqueue)("test.echo", run_at=later)
    slow = socket(client, "page=jobs&since=0")
    connecting = asyncio.create_task(slow.connect(timeout=10))
    try:
        assert await asyncio.to_thread(entered.wait, 5), (
            "the slow socket's catch-up render never began"
        )
        _, victim, job = await opened_on_job(operator)  # connects and says hello meanwhile
        assert await then_the_job_changes() == [job]
        message = await victim.receive_json_from(timeout=5)
        while "swaps" not in message:
            message = await victim.receive_json_from(timeout=5)
        assert [s["id"] for s in message["swaps"]] == ["job-live"]
        assert not finished.is_set()  # the slow render was still running all along
        await victim.disconnect()
    finally:
        gate.set()
    assert (await connecting)[0]
    await slow.receive_json_from(timeout=10)
    await slow.disconnect()


async def test_one_viewers_slow_screens_leave_threads_for_everyone_else(
    operator: User, staff: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One user's sockets take at most consumers.USER_THREADS of the pool at once. Before: a
    viewer opening as many slow screens as the pool has threads held every thread, and another
    user's socket could not even connect (its access check waited behind them)."""
    gate = threading.Event()
    real = broadcast.render_swaps
    started = threading.Semaphore(0)

    def render(screen: broadcast.Screen, pending: Any) -> Any:
        if screen.page == "jobs":
            started.release()
            gate.wait(20)
        return real(screen, pending)

    monkeypatch.setattr(broadcast, "render_swaps", render)
    hog = await sync_to_async(logged_in)(operator)
    # An event after since=0 (a catch-up render), on a job not due: the claim below must change
    # the victim's job. (A due one was claimed in its place, and the victim was pushed only if
    # the tail happened to announce its job's enqueue after its socket joined: 3 runs in 10.)
    later = timezone.now() + timedelta(hours=1)
    await sync_to_async(jobs.enqueue)("test.echo", run_at=later)
    slow = [socket(hog, "page=jobs&since=0") for _ in range(consumers.POOL_THREADS + 1)]
    # Each catch-up render hangs; the hog's sockets past its turns wait to connect.
    connecting = [asyncio.create_task(s.connect(timeout=30)) for s in slow]
    try:
        for n in range(consumers.POOL_THREADS):  # as many as the hog gets (all, before)
            hung = await asyncio.to_thread(started.acquire, timeout=5 if n == 0 else 2)
            assert hung or n >= consumers.USER_THREADS, f"only {n} renders started"
            if not hung:
                break
        _, victim, job = await opened_on_job(staff)  # connects and says hello meanwhile
        assert await then_the_job_changes() == [job]  # after the victim's socket joined
        message = await victim.receive_json_from(timeout=5)
        while "swaps" not in message:
            message = await victim.receive_json_from(timeout=5)
        assert [s["id"] for s in message["swaps"]] == ["job-live"]
        assert not gate.is_set()
        await victim.disconnect()
    finally:
        gate.set()
    for communicator, connected in zip(slow, connecting, strict=True):
        assert (await connected)[0]
        await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()


async def test_a_render_cut_off_by_its_sockets_close_keeps_its_users_turn_until_it_ends(
    operator: User, staff: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push cancelled by its socket's disconnect leaves its render running on the pool (a
    thread cannot be stopped). Before, the user's turn came back at the cancel: opening a slow
    screen and closing it, again and again, held every thread of the pool with one user's
    renders. Now the turn comes back when the render ends."""
    gate = threading.Event()
    real = broadcast.render_swaps
    started = threading.Semaphore(0)

    def render(screen: broadcast.Screen, pending: Any) -> Any:
        if screen.page == "job" and screen.job in hogs:
            started.release()
            gate.wait(20)
        return real(screen, pending)

    hogs: set[int | None] = set()
    monkeypatch.setattr(broadcast, "render_swaps", render)
    try:
        for _ in range(consumers.USER_THREADS):  # each render hangs, its socket goes away
            client = await sync_to_async(logged_in)(operator)
            job = await sync_to_async(jobs.enqueue)("test.echo")
            hogs.add(job.pk)
            since = await sync_to_async(selectors.latest_event_id)()
            hog = socket(client, f"page=job&job={job.pk}&since={since}")
            assert (await hog.connect(timeout=5))[0]
            await hog.receive_json_from(timeout=5)  # its hello
            await then_the_job_changes()
            assert await asyncio.to_thread(started.acquire, timeout=5)
            await hog.disconnect()
        # The same user tries a third render at once, while both hang on the pool.
        job = await sync_to_async(jobs.enqueue)("test.echo")
        hogs.add(job.pk)
        since = await sync_to_async(selectors.latest_event_id)()
        third = socket(client, f"page=job&job={job.pk}&since={since}")
        connecting = asyncio.create_task(third.connect(timeout=30))
        await asyncio.sleep(0)
        await then_the_job_changes()
        assert not await asyncio.to_thread(started.acquire, timeout=2), "a third render ran"
        _, other, _ = await opened_on_job(staff)  # the other threads are free for others
        await other.disconnect()
    finally:
        gate.set()
    assert (await connecting)[0]  # its turn came when a render ended
    await third.disconnect()


async def test_a_flood_of_anonymous_handshakes_is_refused_403_and_denies_nobody_else(
    operator: User,
) -> None:
    """Anonymous handshakes share one entry of the per-user count, but each leaves it before
    its refusal (no query, no await between): a flood of them is refused 4403 each, never
    4429, and a logged-in user's socket opens in the middle of it."""
    flood = [
        socket(None, "page=overview&since=0") for _ in range(consumers.MAX_SOCKETS_PER_USER * 5)
    ]
    attempts = [asyncio.create_task(s.connect(timeout=10)) for s in flood]
    _, mine, _ = await opened_on_job(operator)
    assert {code for _, code in await asyncio.gather(*attempts)} == {4403}
    assert not consumers._OPEN.get(None)
    await mine.disconnect()
