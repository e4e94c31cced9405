"""A real local HTTP receiver for webhook effects and intents, started by a test.

POST /hook records the request under its `Idempotency-Key` header and answers whether it was the
first one with that key (`performed`) or a repeat it deduplicated (`deduplicated`). GET
/check?key=K answers 200 if K was received, else 404 (a target's reconciliation check). With
`failing` set it answers 503 to every POST (a downstream that is down). With `delay` it answers
every POST that many seconds late (a slow target); with `hang` it records the first POST of each
key and then answers nothing for `hang` seconds (a target that hangs past the caller's deadline
after doing the work; a repeat of the key is answered at once).
"""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass
class Received:
    calls: list[tuple[str, str, Any]] = field(default_factory=list)  # (key, verdict, body)
    failing: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""
    delay: float = 0.0
    hang: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    hung: int = 0  # POSTs left unanswered (`hang`)

    def keys(self) -> set[str]:
        with self.lock:
            return {k for k, _, _ in self.calls}

    def verdicts(self, key: str) -> list[str]:
        with self.lock:
            return [v for k, v, _ in self.calls if k == key]

    def posts(self) -> int:
        with self.lock:
            return len(self.calls)


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet request handler that answers JSON (every test receiver's base)."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free local port on a thread; yields the base URL, stops on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _handler(received: Received) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            if received.failing:
                self._answer(503, {"error": "down"})
                return
            key = self.headers.get("Idempotency-Key", "")
            with received.lock:
                seen = any(k == key for k, _, _ in received.calls)
                verdict = "deduplicated" if seen else "performed"
                received.calls.append((key, verdict, body))
                hang = received.hang > 0 and verdict == "performed"
                received.hung += hang
            if received.delay:
                time.sleep(received.delay)  # a slow target: the work is done, the answer late
            if hang and received.stop.wait(received.hang):
                return  # the receiver is stopping: never answered
            try:
                self._answer(200, {"verdict": verdict, "key": key})
            except OSError:
                pass  # the caller gave up waiting

        def do_GET(self) -> None:  # noqa: N802
            key = parse_qs(urlparse(self.path).query).get("key", [""])[0]
            self._answer(200 if key in received.keys() else 404, {"key": key})

    return Handler


@contextmanager
def receiver(delay: float = 0.0, hang: float = 0.0) -> Iterator[Received]:
    received = Received(delay=delay, hang=hang)
    with serving(_handler(received)) as received.url:
        try:
            yield received
        finally:
            received.stop.set()  # a hanging call returns before the server stops
