"""Real local HTTP receivers that are hard on the relay, started by a test.

- `fencing_receiver()`: performs every call it accepts -- it does NOT deduplicate by key -- but
  keeps the receiver contract's token rule (docs/effects.md): it remembers the highest
  `X-Relay-Token` presented for a key (by a call or a check) and refuses (409) a call whose token
  is lower, deciding it atomically with the effect. Its check (`GET /check?key=K&token=N`)
  answers 200 if K was performed, else 404. With `hold_first` its first call stalls inside its
  work until the test sets `release` (a target slower than the relay's deadline). With `delay`
  it answers every call that many seconds after deciding it (a slow target); with `hang` it
  decides the first call of each key and then answers nothing for `hang` seconds (a target that
  hangs past the relay's deadline after doing the work). `checks` holds each check's path and
  query as sent.
- `trickling_server()`: answers every request one byte at a time, for ever (a target a
  per-read timeout never cuts); counts its connections.
- `scripted_server(answer)`: reads each request (its headers and `Content-Length` body), writes
  the bytes `answer` as they are -- interim 1xx answers, odd status lines, whatever a test
  scripts -- then closes; keeps each request's bytes.
- `blackholed_address()`: a local address whose SYNs go unanswered (a listening socket whose
  accept queue is full: the kernel drops every further SYN), so a connect() to it hangs.
"""

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.receiver import JsonHandler, serving


@dataclass
class Fencing:
    performed: list[tuple[str, int]] = field(default_factory=list)  # (key, token)
    refused: list[tuple[str, int]] = field(default_factory=list)
    highest: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hold_first: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    calls: int = 0
    ended: int = 0  # calls whose work is decided (performed or refused)
    url: str = ""
    delay: float = 0.0
    hang: float = 0.0
    hung: int = 0  # calls left unanswered (`hang`)
    stop: threading.Event = field(default_factory=threading.Event)
    performed_at: list[float] = field(default_factory=list)  # time.time() of each perform
    checks: list[str] = field(default_factory=list)  # each check's path and query, as sent

    def performs(self, key: str) -> list[int]:
        with self.lock:
            return [t for k, t in self.performed if k == key]


def _fencing_handler(r: Fencing) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = self.headers.get("Idempotency-Key", "")
            token = int(self.headers.get("X-Relay-Token") or 0)
            with r.lock:
                r.calls += 1
                first = r.calls == 1
                if token < r.highest.get(key, 0):
                    r.refused.append((key, token))
                    self._answer(409, {"refused": token})
                    return
                r.highest[key] = token
            if first and r.hold_first:
                r.release.wait(30)  # slow work, longer than the relay waits
            hang = False
            with r.lock:  # the effect and the token check decided together
                if token < r.highest.get(key, 0):
                    r.refused.append((key, token))
                    status = 409
                else:
                    first_of_key = all(k != key for k, _ in r.performed)
                    r.performed.append((key, token))
                    r.performed_at.append(time.time())
                    status = 200
                    hang = r.hang > 0 and first_of_key
                    r.hung += hang
                r.ended += 1
            if r.delay:
                time.sleep(r.delay)  # a slow target: decided, answered late
            if status == 200 and hang and r.stop.wait(r.hang):
                return  # stopping: never answered
            try:
                self._answer(status, {"token": token})
            except OSError:
                pass  # the relay gave up waiting: the outcome was unknown to it

        def do_GET(self) -> None:  # noqa: N802
            query = parse_qs(urlparse(self.path).query)
            key = query.get("key", [""])[0]
            token = int(query.get("token", ["0"])[0] or 0)
            with r.lock:
                r.checks.append(self.path)
                r.highest[key] = max(r.highest.get(key, 0), token)
                done = any(k == key for k, _ in r.performed)
            self._answer(200 if done else 404, {"key": key})

    return Handler


@contextmanager
def fencing_receiver(hold_first: bool = False, delay: float = 0.0, hang: float = 0.0
                     ) -> Iterator[Fencing]:  # fmt: skip
    r = Fencing(hold_first=hold_first, delay=delay, hang=hang)
    with serving(_fencing_handler(r)) as r.url:
        try:
            yield r
        finally:
            r.release.set()  # a held first call returns before the server stops
            r.stop.set()


@dataclass
class Trickle:
    connections: int = 0
    url: str = ""
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def trickling_server(byte_every: float = 0.2) -> Iterator[Trickle]:
    t = Trickle()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with t.lock:
                t.connections += 1
            self.request.recv(65536)
            answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 100_000
            for byte in answer:
                if t.stop.wait(byte_every):
                    return
                try:
                    self.request.sendall(bytes([byte]))
                except OSError:
                    return

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    t.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield t
    finally:
        t.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class Scripted:
    url: str = ""
    requests: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def scripted_server(answer: bytes, hold: float = 0.0) -> Iterator[Scripted]:
    """Answer every request with `answer`, then (after `hold` seconds) close the connection."""
    s = Scripted()
    stop = threading.Event()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline(65537)
                if not line:
                    return
                head += line
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = self.rfile.read(length)
            with s.lock:
                s.requests.append(head + body)
            try:
                self.wfile.write(answer)
                self.wfile.flush()
            except OSError:
                return
            stop.wait(hold)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    s.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield s
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def blackholed_address() -> Iterator[tuple[str, int]]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    address = server.getsockname()
    held: list[socket.socket] = [server]
    try:
        for _ in range(16):  # fill the accept queue until a connect goes unanswered
            probe = socket.socket()
            probe.settimeout(0.2)
            try:
                probe.connect(address)
            except TimeoutError:
                probe.close()
                break
            held.append(probe)
        else:
            raise AssertionError("the accept queue never filled")
        yield address
    finally:
        for sock in held:
            sock.close()


def wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)  # poll interval of a deadline-bound wait
