"""One HTTP exchange under one total deadline: resolving, connecting, TLS, sending, the answer.

Owns: how the built-in webhook (jobs/effects/webhook.py) talks to a receiver, and the line
between "nothing was sent" (`Refused`: safe to call again) and "the request may have arrived"
(`OutcomeUnknown`: reconcile first).
- The name is resolved on a helper thread (getaddrinfo cannot be interrupted), waited for no
  longer than the time left; a resolver that answers later is left to finish on its own.
- Each address is tried with a share of the time left (the time left over the addresses not yet
  tried), so a receiver whose first address drops SYNs is still reached, and a name with many
  blackholed addresses costs the deadline, never the deadline once per address.
- Once a socket is connected, a timer shuts it down at the deadline (through a duplicate of it,
  so the TLS handshake is cut too): a receiver trickling its answer a byte at a time holds the
  call until the deadline, not for ever.
- Interim (1xx) answers are read past, to the final answer (`FinalAnswer`).
- Anything that fails before the first byte of the request is handed to the socket (no address,
  no connection in time, a TLS failure, a URL http.client will not write) is `Refused`; anything
  from then on is `OutcomeUnknown` -- an answer the cut ended too: http.client reads the cut as
  an end of file, which can end the headers after a status line, and that status is no answer.

Never: waits longer than the deadline for one exchange (plus the moment a cut socket takes to
fail its read); reads more than MAX_ANSWER bytes of an answer.

Hazards: a resolver that hangs keeps its helper thread until the system resolver gives up (its
own timeouts, resolv.conf): at most one such thread per call the relay started.
"""

import http.client
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

MAX_ANSWER = 64 * 1024
MAX_INTERIM = 16  # 1xx answers read past before a final one: more is no answer (unknown)
MAX_INTERIM_HEADERS, MAX_HEADER_LINE = 100, 65536  # per 1xx answer, as http.client's own bounds


class OutcomeUnknown(Exception):
    """The call may or may not have reached the target: reconcile before calling again."""


class Refused(Exception):
    """The target did not perform the call (it said so, or nothing was sent): safe to retry."""


def resolve(host: str, port: int, seconds: float) -> list[Any]:
    """getaddrinfo(host, port) for a TCP stream, waited for at most `seconds` (TimeoutError)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        except BaseException as exc:  # noqa: BLE001  handed to the caller, who decides
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="jobs-webhook-resolve", daemon=True).start()
    if not done.wait(max(seconds, 0.0)):
        raise TimeoutError(f"{host!r:.100} not resolved within {seconds:.3g} s")
    if "error" in box:
        raise box["error"]
    return list(box["infos"])


class FinalAnswer(http.client.HTTPResponse):
    """An answer read past any interim (1xx) answers to the final one: RFC 9110 15.2 -- a client
    parses any number of them before the final answer, even unasked for. http.client skips only
    `100 Continue`, and took a `103 Early Hints` or `102 Processing` for the answer itself (an
    unknown outcome for a receiver that went on to answer 200). A `101 Switching Protocols` is
    kept as the answer: the relay never asks for one, so it is no final answer we could read
    (unknown). 1xx answers and then nothing -- a close, the deadline, or more than MAX_INTERIM
    of them (a receiver streaming them would keep a relay thread reading at full speed until
    the deadline) -- stay unknown.

    Overrides http.client's private `_read_status` (begin() reads each status line through it,
    in 3.12 to 3.14; there is no public hook for interim answers) and nothing else private: an
    interim answer's headers are skipped here, bounded like http.client's own. Its private
    `_read_headers` took a second, required argument in 3.14: called with one, every 103 was a
    TypeError. tests/integration/test_webhook_interim.py fails if a Python release changes that."""

    interim = 0  # answers read past so far (100 included: begin() skips a 100's headers)

    def _read_status(self) -> tuple[str, int, str]:
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if 100 <= status < 200 and status != 101:
                self.interim += 1
                if self.interim > MAX_INTERIM:  # a receiver streaming them: no final answer
                    raise http.client.HTTPException(f"more than {MAX_INTERIM} 1xx answers")
            if not 100 < status < 200 or status == 101:
                return version, status, reason
            _skip_headers(self.fp)


def _skip_headers(fp: Any) -> None:
    """Read past an interim answer's header lines, bounded as http.client bounds a header."""
    for _ in range(MAX_INTERIM_HEADERS + 1):
        line = fp.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):  # the blank line ending them, or the end of file
            return
    raise http.client.HTTPException(f"more than {MAX_INTERIM_HEADERS} headers in a 1xx answer")


class Call:
    """One exchange with `url` (http or https, already checked by the caller) under `timeout`."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.conn = cls(parts.hostname or "", parts.port, timeout=timeout)
        self.conn.response_class = FinalAnswer
        # Its connect() opens the socket through open(), bounded by the deadline (HTTPS then
        # wraps it as usual); http.client sets this per connection, in __init__.
        self.conn._create_connection = self._create  # type: ignore[attr-defined]
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout = timeout
        self.deadline = 0.0
        self.cut = False
        self._cutter: socket.socket | None = None  # a duplicate of the connected socket
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _create(self, address: tuple[str, int], *_: Any) -> socket.socket:
        return self.open(address[0], address[1])

    def open(self, host: str, port: int) -> socket.socket:
        """Resolve and connect within the time left; the connected socket, armed for the cut."""
        infos = resolve(host, port, self.left())
        error: OSError | None = None if infos else OSError(f"{host!r:.100} has no address")
        for n, (family, kind, proto, _, address) in enumerate(infos):
            left = self.left()
            if left <= 0:
                break
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(left / (len(infos) - n))  # a share of the time left
                sock.connect(address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            sock.settimeout(max(self.left(), 0.001))  # each read; the timer cuts at the deadline
            try:
                cutter = sock.dup()  # the timer shuts the connection down through it
            except OSError:
                sock.close()
                raise
            with self._lock:
                if not self.cut:
                    self._cutter = cutter
                    return sock
            cutter.close()
            sock.close()
            break
        if error is not None and self.left() > 0:
            raise error
        raise TimeoutError(f"no connection within {self.timeout:g} s") from error

    def _cut(self) -> None:
        with self._lock:
            self.cut = True
            if self._cutter is not None:
                try:
                    self._cutter.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run(self, method: str, body: bytes | None, headers: dict[str, str]) -> int:
        self.deadline = time.monotonic() + self.timeout
        timer = threading.Timer(self.timeout, self._cut)
        timer.daemon = True
        try:
            try:
                timer.start()  # "can't start new thread": nothing sent either
                self.conn.putrequest(method, self.path)  # refuses a URL it cannot write
                for name, value in headers.items():
                    self.conn.putheader(name, value)
                if body is not None:
                    self.conn.putheader("Content-Length", str(len(body)))
                self.conn.connect()
            except Exception as exc:  # noqa: BLE001  nothing was sent: known not performed
                why = f"{type(exc).__name__}: {exc}"[:300]
                within = f" within {self.timeout:g} s" if self.cut else ""
                raise Refused(f"webhook {method}: nothing sent{within}: {why}") from exc
            try:
                self.conn.endheaders(body)  # the first byte of the request leaves here
                response = self.conn.getresponse()
                response.read(MAX_ANSWER)
                with self._lock:
                    cut = self.cut
                if cut:  # what was read ended at the cut (an end of file): it is no answer
                    raise TimeoutError("the answer was cut at the deadline")
                return int(response.status)
            except (OSError, http.client.HTTPException) as exc:
                # Cut by the timer, or the socket's own timeout (the time left) fired first:
                # either way nothing came back in time, and the message says so alike.
                late = self.cut or isinstance(exc, TimeoutError)
                why = f"no answer within {self.timeout:g} s" if late else repr(exc)[:300]
                raise OutcomeUnknown(f"webhook {method}: {why}") from exc
        finally:
            timer.cancel()
            self.conn.close()
            with self._lock:
                self.cut = True  # a timer still running finds nothing to cut
                if self._cutter is not None:
                    self._cutter.close()
                    self._cutter = None
