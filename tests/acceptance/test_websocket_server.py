"""The production web command (docs/operations.md: uvicorn with config.websocket's protocol) as a
hostile client meets it: a client that writes on after its socket was closed is cut off at once,
a message over 64 KiB is refused by the server, and a client that answers the close is let go
promptly. Real processes: the documented command in a subprocess on the test database, a raw
socket client (tests/acceptance/wsclient.py) that does what no websocket library would."""

import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from config import websocket
from tests.acceptance import wsclient
from tests.acceptance.cluster import PROJECT_DIR, subprocess_database_env

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def web_command(port: int) -> list[str]:
    """The web server line of docs/operations.md's production commands, on `port`."""
    section = (
        (PROJECT_DIR / "docs" / "operations.md")
        .read_text()
        .split("## Running it in production", 1)[1]
    )
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block
    (line,) = [ln for ln in block.group(1).splitlines() if ln.startswith(".venv/bin/uvicorn ")]
    line = line.split("  #", 1)[0].replace("--port 8000", f"--port {port}")
    return shlex.split(line.replace("--host 0.0.0.0", "--host 127.0.0.1"))


@pytest.fixture
def web(tmp_path: Path) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"},
        **subprocess_database_env(),
        "PALISADE_ENV_FILE": "none",
    }
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            web_command(port),
            cwd=PROJECT_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)  # the poll interval of a deadline-bound wait for the server
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def cookie() -> str:
    user = User.objects.create_superuser("viewer", password="pw")
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_a_client_writing_on_after_its_socket_is_closed_is_cut_off_at_once(web, cookie):
    sock, rest = wsclient.handshake(web, cookie)
    flood = wsclient.screen_frame() * 500
    stopped = threading.Event()

    def write_on() -> None:  # as fast as the server takes it, never minding the close
        try:
            while not stopped.is_set():
                sock.sendall(flood)
        except OSError:
            pass

    writer = threading.Thread(target=write_on, daemon=True)
    writer.start()
    try:
        reader = wsclient.Reader(sock, rest)
        code = reader.close_code(time.monotonic() + 10)
        closed_at = time.monotonic()
        assert code == 4429  # the consumer's refusal of a flood (dashboard.consumers)
        # uvicorn alone reads and parses on for its close timeout (10 s) while the client writes;
        # the bounded protocol drops the connection once AFTER_CLOSE_BYTES more have come.
        assert reader.ended(closed_at + websocket.CLOSE_SECONDS / 2)
    finally:
        stopped.set()
        sock.close()
        writer.join(timeout=10)
    assert not writer.is_alive()


def test_a_message_over_64_kib_is_refused_by_the_server(web, cookie):
    sock, rest = wsclient.handshake(web, cookie)
    with sock:
        big = b'{"screen": {"page": "jobs", "q": "' + b"x" * (70 * 1024) + b'"}}'
        sock.sendall(wsclient.frame(big))
        code = wsclient.Reader(sock, rest).close_code(time.monotonic() + 10)
    assert code == 1009  # "message too big" (uvicorn's own bound is 16 MiB)


def test_a_client_that_answers_the_close_is_let_go_at_once(web, cookie):
    sock, rest = wsclient.handshake(web, cookie)
    with sock:
        sock.sendall(wsclient.frame(b"not json"))
        reader = wsclient.Reader(sock, rest)
        assert reader.close_code(time.monotonic() + 10) == 4400
        answered = time.monotonic()
        sock.sendall(wsclient.close_frame(4400))
        # Well before the protocol's close timeout: the handshake's end, not the timer.
        assert reader.ended(answered + websocket.CLOSE_SECONDS / 2)


def _writes_until_cut_off(sock: socket.socket, data: bytes, seconds: float) -> bool:
    """Write `data` again and again, never reading (a small receive buffer: the server's
    answers pile up on its side); True if the server ended the connection within `seconds`."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(0.5)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sock.sendall(data)
        except TimeoutError:
            continue  # the server is not reading us (yet): keep trying until the deadline
        except OSError:
            return True  # reset: cut off
    return False


# Frames the application never sees, which uvicorn parsed (and answered) at full speed: one
# client held everybody's pages at p50 0.7-1.7 s and grew the server by 200 MB (a review).
@pytest.mark.parametrize("opcode", [0x9, 0xA], ids=["pings", "pongs"])
def test_a_client_sending_control_frames_in_a_loop_is_cut_off(web, cookie, opcode):
    sock, _ = wsclient.handshake(web, cookie)
    with sock:
        assert _writes_until_cut_off(sock, wsclient.frame(b"p" * 125, opcode) * 200, 5)


def test_a_message_fragmented_into_endless_continuations_is_cut_off(web, cookie):
    sock, _ = wsclient.handshake(web, cookie)
    with sock:
        sock.sendall(wsclient.frame(b"{", fin=False))
        empty = wsclient.frame(b"", opcode=0x0, fin=False)
        assert _writes_until_cut_off(sock, empty * 5000, 5)


def test_no_compression_is_offered(web, cookie):
    # permessage-deflate turned each parsed byte into up to a thousand inflated ones.
    sock, _ = wsclient.handshake(
        web, cookie, headers="Sec-WebSocket-Extensions: permessage-deflate\r\n"
    )
    with sock:
        assert b"sec-websocket-extensions" not in wsclient.last_head.lower()


def test_a_well_behaved_socket_keeps_working_beside_a_flooding_one(web, cookie):
    """The flood's close does not touch another socket of the same server: it still takes
    messages and answers a malformed one with its own close."""
    flooder, _ = wsclient.handshake(web, cookie)
    other, rest = wsclient.handshake(web, cookie)
    with flooder, other:
        try:
            for _ in range(40):
                flooder.sendall(wsclient.screen_frame() * 50)
        except OSError:
            pass  # cut off: the point
        other.sendall(wsclient.screen_frame(q="still here"))
        other.sendall(wsclient.frame(b"[]"))
        assert wsclient.Reader(other, rest).close_code(time.monotonic() + 10) == 4400
