"""A raw websocket client for tests that must behave as a hostile client would (write on after a
close, send frames faster than anyone reads them), which a real websocket library refuses to do."""

import base64
import json
import os
import socket
import struct
import time

MASK = b"\x5a\x13\xc7\x08"


def frame(payload: bytes, opcode: int = 0x1, fin: bool = True) -> bytes:
    """One client frame (masked, as RFC 6455 requires of a client); `fin=False`: a fragment."""
    n, first = len(payload), (0x80 if fin else 0) | opcode
    if n < 126:
        head = struct.pack("!BB", first, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, n)
    masked = bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))
    return head + MASK + masked


def screen_frame(**filters: str) -> bytes:
    return frame(json.dumps({"screen": {"page": "jobs", **filters}}).encode())


def close_frame(code: int = 1000) -> bytes:
    return frame(struct.pack("!H", code), opcode=0x8)


def handshake(
    port: int, cookie: str, timeout: float = 10.0, headers: str = ""
) -> tuple[socket.socket, bytes]:
    """Open /ws/live/ as the session `cookie` (`headers`: more request header lines, each
    ending in CRLF); returns the socket and any bytes past the 101's head (`last_head` holds
    the head)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/live/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: http://127.0.0.1:{port}\r\nCookie: sessionid={cookie}\r\n{headers}\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed during the handshake: {head!r}")
        head += chunk
    head, rest = head.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(f"handshake refused: {head!r}")
    global last_head
    last_head = head
    return sock, rest


last_head = b""  # the head of the last 101 `handshake` read


class Reader:
    """Server frames off a socket (unmasked), until the close frame or the connection's end."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"") -> None:
        self.sock, self.buf = sock, buffered

    def _need(self, n: int, deadline: float) -> bool:
        while len(self.buf) < n:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return False
            if not chunk:
                return False
            self.buf += chunk
        return True

    def next_frame(self, deadline: float) -> tuple[int, bytes] | None:
        """(opcode, payload), or None once the connection has ended."""
        if not self._need(2, deadline):
            return None
        opcode, n = self.buf[0] & 0x0F, self.buf[1] & 0x7F
        at = 2
        if n == 126:
            if not self._need(4, deadline):
                return None
            n, at = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            if not self._need(10, deadline):
                return None
            n, at = struct.unpack("!Q", self.buf[2:10])[0], 10
        if not self._need(at + n, deadline):
            return None
        payload, self.buf = self.buf[at : at + n], self.buf[at + n :]
        return opcode, payload

    def close_code(self, deadline: float) -> int | None:
        """The code of the server's close frame (frames before it skipped); None if none came."""
        while (got := self.next_frame(deadline)) is not None:
            opcode, payload = got
            if opcode == 0x8:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        return None

    def ended(self, deadline: float) -> bool:
        """Whether the server ended the connection (EOF or reset) before `deadline`."""
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                if not self.sock.recv(65536):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
            except TimeoutError:
                return False
        return False
