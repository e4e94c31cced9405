"""config.websocket's protocol parses a client's frames no further ahead than the application takes
them, and loses none: uvicorn's own parses everything a read brings (up to 256 KiB of frames, all
queued for the application at once). A real server socket in this process (asyncio), a raw client,
and an application that takes its messages only when told to."""

import asyncio
import time
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from config.websocket import BURST_BYTES, BYTES_PER_SECOND, FEED_BYTES, BoundedWebSocketProtocol
from tests.acceptance import wsclient

MESSAGES = 3000
PROTOCOLS: dict[int, list[BoundedWebSocketProtocol]] = {}  # by port: the server's connections


async def _serve(app: Any) -> tuple[asyncio.Server, int]:
    config = Config(app=app, lifespan="off", log_level="warning")
    config.load()
    state = ServerState()
    made: list[BoundedWebSocketProtocol] = []

    def factory() -> BoundedWebSocketProtocol:
        made.append(BoundedWebSocketProtocol(config=config, server_state=state, app_state={}))
        return made[-1]

    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    PROTOCOLS[port] = made
    return server, port


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 101")
    return reader, writer


def test_frames_are_parsed_only_as_fast_as_the_application_takes_them():
    asyncio.run(_scenario())


async def _scenario() -> None:
    accepted, take = asyncio.Event(), asyncio.Event()
    taken: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        accepted.set()
        await take.wait()
        while len(taken) < MESSAGES:
            message = await receive()
            assert message["type"] == "websocket.receive", message
            taken.append(message["text"])
        await send({"type": "websocket.close", "code": 1000})

    server, port = await _serve(app)
    reader, writer = await _open(port)
    await asyncio.wait_for(accepted.wait(), 10)

    frames = [wsclient.frame(f"message {i:05d}".encode()) for i in range(MESSAGES)]
    writer.write(b"".join(frames))  # ~57 KiB: one read of the server's takes it all
    await writer.drain()
    (protocol,) = PROTOCOLS[port]
    async with asyncio.timeout(10):
        while not protocol.unparsed:  # the server read them and holds the rest unparsed
            await asyncio.sleep(0.01)
    queued = protocol.queue.qsize()
    assert 0 < queued <= FEED_BYTES // len(frames[0]) + 1, queued

    take.set()  # the application takes its messages: every one arrives, in order
    async with asyncio.timeout(10):
        while len(taken) < MESSAGES:
            await asyncio.sleep(0.01)
    assert taken == [f"message {i:05d}" for i in range(MESSAGES)]
    writer.close()
    server.close()
    await server.wait_closed()


def test_a_client_is_parsed_no_faster_than_its_byte_budget_and_loses_nothing():
    asyncio.run(_budget_scenario())


async def _budget_scenario() -> None:
    """An application taking every message at once: the client's 128 KiB are parsed at the
    budget's pace (BURST_BYTES, then BYTES_PER_SECOND), not as fast as they come."""
    taken: list[tuple[float, str]] = []
    total = 4000

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while len(taken) < total:
            message = await receive()
            assert message["type"] == "websocket.receive", message
            taken.append((time.monotonic(), message["text"]))

    server, port = await _serve(app)
    reader, writer = await _open(port)
    frames = [wsclient.frame(f"m{i:05d}".ljust(26).encode()) for i in range(total)]
    size = len(frames[0])  # 32 bytes: 128,000 in all
    started = time.monotonic()
    writer.write(b"".join(frames))
    await writer.drain()
    async with asyncio.timeout(20):
        while len(taken) < total:
            await asyncio.sleep(0.05)
            elapsed = time.monotonic() - started
            allowed = BURST_BYTES + BYTES_PER_SECOND * elapsed + FEED_BYTES
            assert len(taken) * size <= allowed, (len(taken) * size, elapsed)
    assert [text.strip() for _, text in taken] == [f"m{i:05d}" for i in range(total)]
    assert time.monotonic() - started >= (total * size - BURST_BYTES) / BYTES_PER_SECOND * 0.9
    writer.close()
    server.close()
    await server.wait_closed()
