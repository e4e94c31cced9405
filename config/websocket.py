"""The production ASGI server's websocket protocol: uvicorn's, bounded against a flooding client.

Owns: how much of a client's websocket traffic the server reads and parses. Never: decides who may
connect or how many messages a socket may send -- the dashboard's consumer does
(dashboard.consumers: 10 sockets per user, 10 messages at once then 5 a second, closed 4429/4400
past that). Run as `uvicorn --ws config.websocket:BoundedWebSocketProtocol` (docs/operations.md).

Why: an ASGI server parses every frame a client writes, in its one event-loop thread, before the
application sees any. uvicorn stops reading a socket while the application has messages of it
still to take -- but once the application closes a socket it reads on, parsing and discarding,
until the client answers the close or ten seconds pass; daphne reads and queues without limit
at any time. A client that ignores the close and keeps writing thus held the event loop, and
every other viewer's pushes and pages behind it, for seconds (docs/dashboard.md, "Hostile
readers", the figures). This protocol:

- after the application's close, reads at most AFTER_CLOSE_BYTES more (room for a browser's
  close reply behind the messages it still had in flight), then drops the connection;
- drops a connection whose client has not answered the close within CLOSE_SECONDS (uvicorn: 10);
- refuses a message over MAX_MESSAGE_BYTES (close 1009), whatever `--ws-max-size` says (uvicorn's
  default is 16 MiB; the dashboard's largest message, a screen's filters, is well under 4 KiB).
"""

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

AFTER_CLOSE_BYTES = 64 * 1024
FEED_BYTES = 16 * 1024
CLOSE_SECONDS = 2.0
MAX_MESSAGE_BYTES = 64 * 1024


class BoundedWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_timeout = CLOSE_SECONDS
        size = self.conn.max_message_size
        self.conn.max_message_size = min(size or MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
        self.read_after_close = 0
        self.unparsed = b""

    def data_received(self, data: bytes) -> None:
        if self.close_sent and self.handshake_complete:
            self.read_after_close += len(data)
            if self.read_after_close > AFTER_CLOSE_BYTES:
                # Not an answer to the close: a client writing on. Stop reading it at once (the
                # close frame was written when the application closed).
                self.transport.abort()
                return
        data, self.unparsed = self.unparsed + data, b""
        while data:
            piece, data = data[:FEED_BYTES], data[FEED_BYTES:]
            super().data_received(piece)
            if data and self.read_paused:
                # The application has messages of this socket to take: parse no further
                # until it has taken them (reading is paused meanwhile).
                self.unparsed = data
                return

    async def receive(self) -> Any:
        message = await super().receive()
        if self.unparsed and self.queue.empty():
            self.data_received(b"")
        return message
