"""The fault proxy in front of cluster 0 (tests/integration/pgproxy.py), with one more fault: an
*interceptor* that hands the next client message holding a marker to the nemesis before it is
relayed, and the lookup of the worker process behind a proxied connection.

`intercept(marker, take)`: the next message holding `marker` for which `take(pair, data)` returns
True is no longer relayed by the proxy: `take` (which runs on that connection's relay thread,
so it blocks that connection only) decides what happens to it -- relay it later with
`pair.server.sendall(data)`, swallow the reply, or drop it -- and returns True; a message it
declines (False) is relayed as usual and the interceptor stays armed.

The proxy relays PostgreSQL's wire protocol; Django's psycopg backend binds parameters on the
client side, so a statement arrives as one Query message with its values inline (the commit's
`(<job>::bigint, <attempt>::int, ...)` rows can be read from it).
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable

from tests.integration.pgproxy import PgProxy, _Pair

# The platform's commit statement (jobs/core/sql/postgres.py): unique to it.
COMMIT_MARKER = b"SET state = 'succeeded', result = v.result"
# Its rows travel as arrays, bound on the client where the cursor is Django's client-side one
# (cluster 0 runs with JOBS_PREPARED_STATEMENTS=0): unnest('{12,345}'::int2[]::bigint[],
# '{1,2}'::int2[]::int[], ...). Before 2026-12 they were VALUES rows, (12::bigint, 1::int, ...):
# commit_rows() found none in the array form, and zombie_commit never fired again.
_ARRAYS = re.compile(rb"unnest\('\{([\d,]+)\}'(?:::\w+\[\])?::bigint\[\], "
                     rb"'\{([\d,]+)\}'(?:::\w+\[\])?::int\[\]")  # fmt: skip
_ROW = re.compile(rb"\((\d+)::bigint, (\d+)::int")


def commit_rows(data: bytes) -> list[tuple[int, int]]:
    """(job, attempt) of every row a commit statement presents."""
    if m := _ARRAYS.search(data):
        ids, attempts = m.group(1).split(b","), m.group(2).split(b",")
        return [(int(j), int(a)) for j, a in zip(ids, attempts, strict=False)]
    return [(int(j), int(a)) for j, a in _ROW.findall(data)]


class ChaosProxy(PgProxy):
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        # Armed interceptors, each (marker, take): one per held-statement fault (a zombie's
        # commit, a zombie's INSERT or DELETE), each disarmed once its take() took a message.
        self._take: list[tuple[bytes, Callable[[_Pair, bytes], bool]]] = []
        self._take_lock = threading.Lock()
        self._disarmed = 0  # how many times every interceptor was disarmed
        super().__init__(upstream_host, upstream_port)

    def intercept(self, marker: bytes, take: Callable[[_Pair, bytes], bool] | None) -> None:
        """Arm `take` for the next message holding `marker` (beside any other armed one);
        `take` None disarms every interceptor."""
        with self._take_lock:
            if take is None:
                self._take, self._disarmed = [], self._disarmed + 1
            elif marker:
                self._take = [*self._take, (marker, take)]

    def _offer(self, pair: _Pair, data: bytes) -> bool:
        """Offer the message to each interceptor armed for it, each taken off the list while its
        take() decides (a take may hold its message for a minute: another connection's message
        must not reach the same interceptor meanwhile); one that declines is armed again."""
        for marker, take in list(self._take):
            if marker not in data:
                continue
            with self._take_lock:
                if (marker, take) not in self._take:
                    continue  # another connection's message is being decided by it
                self._take.remove((marker, take))
                disarmed = self._disarmed
            if take(pair, data):
                return True
            with self._take_lock:
                if self._disarmed == disarmed:  # not disarmed meanwhile (the run's end)
                    self._take.append((marker, take))
        return False

    def _client_to_server(self, pair: _Pair) -> None:
        client, server = pair.client, pair.server
        try:
            while data := client.recv(65536):
                self._flowing.wait()
                if pair.dead:
                    return
                if self._take and self._offer(pair, data):
                    continue  # the interceptor decided this message's fate
                if self._armed is not None and self._marker in data:
                    # the inherited commit cut: hand the rest of the connection to PgProxy
                    self._cut(pair, data)
                    return
                server.sendall(data)
        except OSError:
            pass
        finally:
            self._end(pair)

    def _cut(self, pair: _Pair, data: bytes) -> None:
        after_reply = self._take_arm()
        if after_reply is None:
            pair.server.sendall(data)
            return
        self.cuts += 1
        if after_reply:
            pair.relay_on = False  # swallow the server's answer
            pair.server.sendall(data)
            pair.answered.wait(timeout=10)
        if self._hold_after_cut:
            self.hold()
        for s in (pair.client, pair.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def socket_owner(pair: _Pair, proxy_port: int, pids: list[int]) -> int | None:
    """The pid (among `pids`) whose socket is the client end of this proxied connection."""
    try:
        port = pair.client.getpeername()[1]
    except OSError:
        return None
    inode = _inode(port, proxy_port)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
                except OSError:
                    continue
        except OSError:
            continue
    return None


def _inode(local_port: int, remote_port: int) -> str | None:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    f = line.split()
                    if (int(f[1].rsplit(":", 1)[1], 16) == local_port
                            and int(f[2].rsplit(":", 1)[1], 16) == remote_port):  # fmt: skip
                        return f[9]
        except OSError:
            continue
    return None


def group_pids(pgid: int) -> list[int]:
    """Every live process of a process group (from /proc), sorted."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            found.append(int(entry))
    return sorted(found)
