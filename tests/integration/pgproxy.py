"""A fault-injecting TCP proxy in front of PostgreSQL.

Commit-outcome-unknown: armed with `cut_on(marker, after_reply=...)`, the next client message
containing `marker` (a COMMIT, or a statement that commits on its own in autocommit) is handled so
the client's connection dies with the outcome unknown to it:
- after_reply=True: the message reaches the server and the server answers (so it committed),
  but the answer is never relayed; both sockets are shut down.
- after_reply=False: the connection is cut before the message reaches the server.

Partitions: `hold()` stops relaying in both directions on every connection, new ones included
(their startup packet is held too), while every socket stays open: to the client the database
has gone silent. The proxy's kernel still acknowledges what the client sends, so only a
client-side deadline can notice -- the case TCP keepalives cannot catch. `heal()` resumes
relaying; `reset()` kills every connection (what a restarted server or a NAT that forgot its
state looks like to the client) and lets new connections through.
"""

import socket
import struct
import threading
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    server: socket.socket
    dead: bool = False
    relay_on: bool = True
    answered: threading.Event = field(default_factory=threading.Event)
    # name -> text of the statements the client prepared on this connection
    prepared: dict[bytes, bytes] = field(default_factory=dict)


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    """The (type, body) of each whole frontend message in `data` (none for a startup packet)."""
    out, pos = [], 0
    while pos + 5 <= len(data):
        kind, length = data[pos], struct.unpack("!i", data[pos + 1 : pos + 5])[0]
        if not 32 < kind < 127 or length < 4 or pos + 1 + length > len(data):
            break
        out.append((kind, data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out


def _carries(pair: _Pair, data: bytes, marker: bytes) -> bool:
    """Whether `data` runs a statement holding `marker`: sent with its text (a simple query, or
    an extended one with its Execute), or -- a prepared statement's execution sends only its
    name -- a Bind of a statement prepared with that text. A Parse alone runs nothing."""
    hit = False
    messages = _messages(data)
    for kind, body in messages:
        if kind == ord("P"):
            name, _, rest = body.partition(b"\0")
            if name:
                pair.prepared[name] = rest.partition(b"\0")[0]
        elif kind == ord("B"):
            name = body.partition(b"\0")[2].partition(b"\0")[0]
            hit = hit or bool(name) and marker in pair.prepared.get(name, b"")
    runs = not messages or any(kind in (ord("Q"), ord("E")) for kind, _ in messages)
    return hit or (runs and marker in data)


class PgProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._armed: bool | None = None  # None: pass through; else cut mode (after_reply)
        self._marker = b"COMMIT"
        self._hold_after_cut = False
        self._away_after_cut: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._flowing = threading.Event()
        self._flowing.set()
        self.cuts = 0
        self.resets = 0
        self.held_messages = 0  # client messages that arrived while holding
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    # -- faults ----------------------------------------------------------------------------

    def cut_on(
        self,
        marker: bytes,
        *,
        after_reply: bool,
        then_hold: bool = False,
        then_away: tuple[str, int] | None = None,
    ) -> None:
        """Cut the next message holding `marker`; `then_hold`: and go silent at that moment;
        `then_away`: and, before the client can see the cut, relay new connections to that
        address (a closed port: every reconnect refused) and reset every other connection --
        the database gone at the moment of the cut, until the test sets `upstream` back."""
        with self._lock:
            self._marker, self._armed, self._hold_after_cut = marker, after_reply, then_hold
            self._away_after_cut = then_away

    def hold(self) -> None:
        """Relay nothing more, in either direction, on any connection (sockets stay open)."""
        with self._lock:
            self.held_messages = 0
        self._flowing.clear()

    def heal(self) -> None:
        """Relay again; held bytes flow on."""
        self._flowing.set()

    def reset(self) -> int:
        """Kill every connection with a reset, then let new connections through."""
        with self._lock:
            pairs, self._pairs = list(self._pairs), set()
        for pair in pairs:
            pair.dead = True
            for s in (pair.client, pair.server):
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RD)  # wakes the relay thread blocked in recv()
                except OSError:
                    pass
        self._flowing.set()
        for pair in pairs:
            for s in (pair.client, pair.server):
                s.close()  # SO_LINGER 0: a reset, not an orderly close
        self.resets += 1
        return len(pairs)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def close(self) -> None:
        self._closing = True
        self._flowing.set()
        self.listener.close()

    # -- relaying --------------------------------------------------------------------------

    def _take_arm(self) -> bool | None:
        with self._lock:
            armed, self._armed = self._armed, None
            return armed

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._client_to_server, args=(pair,), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(pair,), daemon=True).start()

    def _client_to_server(self, pair: _Pair) -> None:
        client, server = pair.client, pair.server
        try:
            while data := client.recv(65536):
                if not self._flowing.is_set():
                    with self._lock:
                        self.held_messages += 1
                self._flowing.wait()  # a partition holds the bytes here
                if pair.dead:
                    return
                if _carries(pair, data, self._marker) and self._armed is not None:
                    after_reply = self._take_arm()
                    if after_reply:
                        pair.relay_on = False  # swallow the server's answer
                        server.sendall(data)
                        # Once the server has answered, the commit has happened.
                        pair.answered.wait(timeout=10)
                    # shutdown(), not just close(): the relay thread is blocked in recv() on
                    # these sockets, which would keep them open (and the server's transaction
                    # holding its row lock) after a bare close().
                    if self._hold_after_cut:
                        self.hold()  # the client cannot learn the outcome until heal()/reset()
                    # Counted once the cut is in place (hold included) and before the client can
                    # see it: a test that waits for the cut and then heals or resets must not run
                    # between the two (its reset undone by a hold applied after it).
                    self.cuts += 1
                    if self._away_after_cut is not None:
                        self.upstream = self._away_after_cut
                        self.reset()  # this connection too: the client sees a reset
                    for s in (client, server):
                        s.shutdown(socket.SHUT_RDWR)
                    return
                server.sendall(data)
        except OSError:
            pass
        finally:
            self._end(pair)

    def _server_to_client(self, pair: _Pair) -> None:
        try:
            while data := pair.server.recv(65536):
                self._flowing.wait()
                if pair.dead:
                    return
                if not pair.relay_on:
                    pair.answered.set()
                    return
                pair.client.sendall(data)
        except OSError:
            return
        finally:
            # A cut connection is ended by the cutting thread, once its hold, count and "away"
            # are in place: ended here, the client saw the cut (and could reconnect) first.
            if pair.relay_on:
                self._end(pair)

    def _end(self, pair: _Pair) -> None:
        with self._lock:
            self._pairs.discard(pair)
        if pair.dead:
            return  # reset() closes these sockets itself
        for s in (pair.client, pair.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
