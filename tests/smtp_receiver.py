"""A real local SMTP server for the mail tests (RFC 5321's plain subset: EHLO/HELO, MAIL, RCPT,
DATA, RSET, NOOP, QUIT), started by a test on a free port.

Like a real mail server it deduplicates nothing: every message it accepts is kept, in order,
with its `Message-ID`. `hold_first_reply` makes it keep the first message and then hold back
its `250` until the test sets `release` -- a worker that stopped before it heard the answer.
"""

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes

MAX_MESSAGE = 1024 * 1024


@dataclass
class Mailbox:
    messages: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hold_first_reply: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    port: int = 0

    def message_ids(self) -> list[str]:
        with self.lock:
            return [str(message_from_bytes(m)["Message-ID"]) for m in self.messages]

    def count(self) -> int:
        with self.lock:
            return len(self.messages)


def _handler(box: Mailbox) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        def reply(self, line: str) -> None:
            self.wfile.write(line.encode() + b"\r\n")
            self.wfile.flush()

        def handle(self) -> None:
            self.reply("220 test.smtp ready")
            while True:
                line = self.rfile.readline(1000)
                if not line:
                    return
                verb = line.strip().split(b" ", 1)[0].upper()
                if verb in (b"EHLO", b"HELO"):
                    self.reply("250 test.smtp")
                elif verb in (b"MAIL", b"RCPT", b"RSET", b"NOOP"):
                    self.reply("250 OK")
                elif verb == b"DATA":
                    self.reply("354 end with <CRLF>.<CRLF>")
                    self.data()
                elif verb == b"QUIT":
                    self.reply("221 bye")
                    return
                else:
                    self.reply("502 not implemented")

        def data(self) -> None:
            lines: list[bytes] = []
            size = 0
            while True:
                line = self.rfile.readline(MAX_MESSAGE)
                if not line or line in (b".\r\n", b".\n"):
                    break
                size += len(line)
                if size <= MAX_MESSAGE:
                    lines.append(line[1:] if line.startswith(b"..") else line)
            with box.lock:
                box.messages.append(b"".join(lines))
                hold = box.hold_first_reply and len(box.messages) == 1
            if hold:  # accepted and stored; the sender does not hear it (yet)
                box.release.wait(30)
            self.reply("250 queued")

    return Handler


@contextmanager
def smtp_server() -> Iterator[Mailbox]:
    box = Mailbox()
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(box))
    server.daemon_threads = True
    box.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box
    finally:
        box.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
