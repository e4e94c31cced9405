"""A cluster started while its database refuses connections waits for it, then runs jobs.

Found by the fault-injection suite (docs/chaos.md): a cluster restarted while PostgreSQL was
crashing died at start -- django-q2's ORM broker reads the connection's autocommit flag when it
is made, and the error it raised ended the sentinel and with it the cluster. Here a gate in front
of the database closes every connection at once ("server closed the connection unexpectedly")
until the test opens it.
"""

import socket
import threading
from collections.abc import Iterator

import pytest
from django.db import connection

from jobs import enqueue
from tests.acceptance.cluster import subprocess_database_url, wait_for_state, wait_until


class Gate:
    """Closes every connection while `refusing`; afterwards relays each to PostgreSQL."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.refusing = threading.Event()
        self.refusing.set()
        self.refused = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing.is_set():
                self.refused += 1
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def gate(transactional_db: None) -> Iterator[Gate]:
    s = connection.settings_dict
    g = Gate((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    try:
        yield g
    finally:
        g.listener.close()


def test_a_cluster_started_while_the_database_refuses_waits_and_then_runs_jobs(
    gate, start_qcluster
):
    cluster = start_qcluster(DATABASE_URL=subprocess_database_url(via_port=gate.port))
    wait_until(
        lambda: gate.refused >= 20 or cluster.proc.poll() is not None,
        timeout=60, what="the cluster to try and be refused", job_id=0,
    )  # fmt: skip
    assert cluster.proc.poll() is None, "the cluster died while the database refused it"
    gate.refusing.clear()
    job = enqueue("test.echo", {"after": "the outage"})
    wait_for_state(job.pk, "succeeded", timeout=60)
    assert cluster.proc.poll() is None
