"""A fault-injecting TCP proxy in front of PostgreSQL, for commit-outcome-unknown tests.

Armed with `cut_on(marker, after_reply=...)`, the next client message containing `marker` (a
COMMIT, or a statement that commits on its own in autocommit) is handled so the client's
connection dies with the outcome unknown to it:
- after_reply=True: the message reaches the server and the server answers (so it committed),
  but the answer is never relayed; both sockets are shut down.
- after_reply=False: the connection is cut before the message reaches the server.
"""

import socket
import threading


class PgProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self._armed: bool | None = None  # None: pass through; else cut mode (after_reply)
        self._marker = b"COMMIT"
        self._lock = threading.Lock()
        self.cuts = 0
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_on(self, marker: bytes, *, after_reply: bool) -> None:
        with self._lock:
            self._marker, self._armed = marker, after_reply

    def close(self) -> None:
        self._closing = True
        self.listener.close()

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
            server = socket.create_connection(self.upstream)
            threading.Thread(
                target=self._client_to_server, args=(client, server), daemon=True
            ).start()

    def _client_to_server(self, client: socket.socket, server: socket.socket) -> None:
        relay = {"on": True, "answered": threading.Event()}
        threading.Thread(
            target=self._server_to_client, args=(server, client, relay), daemon=True
        ).start()
        try:
            while data := client.recv(65536):
                if self._armed is not None and self._marker in data:
                    after_reply = self._take_arm()
                    self.cuts += 1
                    if after_reply:
                        relay["on"] = False  # swallow the server's answer
                        server.sendall(data)
                        # Once the server has answered, the commit has happened.
                        relay["answered"].wait(timeout=10)
                    # shutdown(), not just close(): the relay thread is blocked in recv() on
                    # these sockets, which would keep them open (and the server's transaction
                    # holding its row lock) after a bare close().
                    for s in (client, server):
                        s.shutdown(socket.SHUT_RDWR)
                    return
                server.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    @staticmethod
    def _server_to_client(server: socket.socket, client: socket.socket, relay: dict) -> None:
        try:
            while data := server.recv(65536):
                if not relay["on"]:
                    relay["answered"].set()
                    return
                client.sendall(data)
        except OSError:
            return
