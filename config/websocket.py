"""The production ASGI server's websocket protocol: uvicorn's, bounded against a hostile client.

Owns: how much of a client's websocket traffic the server reads, parses and answers. Never:
decides who may connect or how many messages a socket may send -- the dashboard's consumer does
(dashboard.consumers: 10 sockets per user, 10 messages at once then 5 a second, closed 4429/4400
past that). Run as `uvicorn --ws config.websocket:BoundedWebSocketProtocol` (docs/operations.md).

Why: an ASGI server parses every frame a client writes, in its one event-loop thread, before the
application sees any. uvicorn stops reading a socket while the application has messages of it
still to take -- but it parses a whole read (256 KiB) at once, never stops for frames that never
reach the application (pings, pongs, a message fragmented into endless empty continuations),
answers every ping into its write buffer whether or not the client reads, inflates compressed
frames, and after the application's close reads and parses on until the client answers or ten
seconds pass. Daphne reads and queues without limit at any time. A client doing any of that held
the event loop, and every other user's pages and pushes behind it, for seconds (docs/dashboard.md,
"Hostile readers"). This protocol:

- parses at most FEED_BYTES ahead of what the application has taken, and at most
  BYTES_PER_SECOND a second (BURST_BYTES at once) whatever the frames are -- a client writing
  faster waits in its TCP window, unread;
- stops reading a client that does not read what it is sent (the write buffer past asyncio's
  high-water mark: pongs to a ping flood, pushes);
- drops a connection that sends a fragmented message (the dashboard's client never fragments),
  or pings and pongs beyond CONTROL_BURST at once and CONTROL_PER_SECOND after (a browser sends
  none but its pongs to the server's keepalive pings, one each 20 s);
- offers no compression (permessage-deflate would turn each parsed byte into up to a thousand);
- after the application's close, parses at most AFTER_CLOSE_BYTES more (room for the client's
  close reply), then drops the connection; and any close gives the client CLOSE_SECONDS to take
  what is written, then drops it (uvicorn's closes otherwise wait for ever on a client that does
  not read);
- refuses a message over MAX_MESSAGE_BYTES (close 1009), whatever `--ws-max-size` says (uvicorn's
  default is 16 MiB; the dashboard's largest message, a screen's filters, is under 4 KiB).
"""

import asyncio
import time
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

AFTER_CLOSE_BYTES = 64 * 1024
FEED_BYTES = 16 * 1024
BURST_BYTES, BYTES_PER_SECOND = 64 * 1024, 32 * 1024
CONTROL_BURST, CONTROL_PER_SECOND = 5, 1.0
CLOSE_SECONDS = 2.0
MAX_MESSAGE_BYTES = 64 * 1024


class _Bucket:
    def __init__(self, burst: float, per_second: float) -> None:
        self.burst, self.rate = burst, per_second
        self.level, self.at = burst, time.monotonic()

    def available(self) -> float:
        now = time.monotonic()
        self.level, self.at = min(self.burst, self.level + (now - self.at) * self.rate), now
        return self.level

    def take(self, amount: float) -> bool:
        if self.available() < amount:
            return False
        self.level -= amount
        return True

    def seconds_until(self, amount: float) -> float:
        return max(0.0, (amount - self.available()) / self.rate)


class _ClosingTransport:
    """The connection's transport, whose `close()` gives the client CLOSE_SECONDS to take what
    is written and then drops it (asyncio's close waits for the write buffer to drain)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop

    def close(self) -> None:
        self._transport.close()
        self._loop.call_later(CLOSE_SECONDS, self._transport.abort)  # a no-op once it is gone

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_timeout = CLOSE_SECONDS
        size = self.conn.max_message_size
        self.conn.max_message_size = min(size or MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
        self.conn.available_extensions = []  # no permessage-deflate: see the module docstring
        self.unparsed = b""
        self.read_after_close = 0
        self.close_counted = False
        self.bytes = _Bucket(BURST_BYTES, BYTES_PER_SECOND)
        self.controls = _Bucket(CONTROL_BURST, CONTROL_PER_SECOND)
        self.write_paused = False
        self.refill: asyncio.TimerHandle | None = None
        self.dropped = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.transport = _ClosingTransport(transport, self.loop)  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refill is not None:
            self.refill.cancel()
        self.unparsed = b""
        super().connection_lost(exc)

    def drop(self) -> None:
        """End a hostile connection at once: nothing more is read, parsed or written."""
        self.dropped, self.unparsed = True, b""
        self.transport.abort()

    # -- reading, bounded ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.dropped:
            return
        if self.close_counted:
            self.read_after_close += len(data)
            if self.read_after_close > AFTER_CLOSE_BYTES:
                self.drop()  # not an answer to the close: a client writing on
                return
        self.unparsed += data
        self.feed()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if self.close_sent and not self.close_counted:  # the application's close went out
            self.close_counted = True
            self.read_after_close = len(self.unparsed)  # what came before it counts too

    def feed(self) -> None:
        """Parse what has come, as far as the application, the client's reading and the byte
        budget allow; whatever is left waits unparsed, with the socket not read meanwhile."""
        self.refill = None
        while self.unparsed and not self.dropped and not self.read_paused:
            if self.write_paused:
                self.transport.pause_reading()
                return
            n = min(FEED_BYTES, len(self.unparsed), int(self.bytes.available()))
            if n <= 0:
                self.transport.pause_reading()
                if self.refill is None:
                    wait = self.bytes.seconds_until(min(FEED_BYTES, len(self.unparsed)))
                    self.refill = self.loop.call_later(wait, self.resume)
                return
            self.bytes.take(n)
            piece, self.unparsed = self.unparsed[:n], self.unparsed[n:]
            super().data_received(piece)
        if not self.unparsed and not self.read_paused and not self.write_paused:
            self.resume_reading_if_open()

    def resume(self) -> None:
        self.refill = None
        if self.unparsed:
            self.feed()
        elif not self.read_paused and not self.write_paused:
            self.resume_reading_if_open()

    def resume_reading_if_open(self) -> None:
        if not self.dropped and not self.transport.is_closing():
            self.transport.resume_reading()

    async def receive(self) -> Any:
        message = await super().receive()  # resumes reading once the application has all
        if self.unparsed and self.queue.empty() and self.refill is None:
            self.transport.pause_reading()  # what came first is parsed first
            self.feed()
        return message

    def pause_writing(self) -> None:
        super().pause_writing()
        self.write_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.write_paused = False
        self.resume()

    # -- frames the application never sees -----------------------------------------------------

    def handle_ping(self) -> None:
        if self._control_allowed():
            super().handle_ping()

    def handle_pong(self, event: Any) -> None:
        if self._control_allowed():
            super().handle_pong(event)

    def _control_allowed(self) -> bool:
        if not self.dropped and not self.controls.take(1):
            self.drop()
        return not self.dropped

    def handle_text(self, event: Any) -> None:
        if self._whole(event):
            super().handle_text(event)

    def handle_bytes(self, event: Any) -> None:
        if self._whole(event):
            super().handle_bytes(event)

    def _whole(self, event: Any) -> bool:
        if not self.dropped and not event.fin:
            self.drop()  # a fragmented message: never the dashboard's client
        return not self.dropped

    def handle_cont(self, event: Any) -> None:
        self.drop()

    def handle_close(self, event: Any) -> None:
        if not self.dropped:
            super().handle_close(event)
