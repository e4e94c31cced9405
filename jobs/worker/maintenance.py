"""The outbox relay and the orphan janitor, on a thread of the embedded scheduler.

Owns: when the relay and the janitor run. Never: runs on the scheduler's own thread -- a slow
webhook or storage backend must not delay the lease reaper or drain dispatch.

Hazards: the thread has its own database connection (Django's are per thread) and closes it on
exit and after any database error; a database outage is logged once, then reminded, then its
recovery (jobs.core.connectivity.OutageLog), any other error with its traceback, and the loop goes
on after a pause. Both tasks are safe with several schedulers at once (SKIP LOCKED claims,
fenced marks). Its round trips are not under the platform's deadline (a webhook or a storage
backend may rightly be slow); libpq's keepalives bound a dead peer, and a stop never waits for
it longer than STOP_SECONDS (a daemon thread: the process exits without it).
"""

import logging
import threading
import time

from django.db import DatabaseError, connection

from jobs.core.conf import jobs_settings
from jobs.core.connectivity import OutageLog
from jobs.effects import janitor, outbox

logger = logging.getLogger("jobs.maintenance")

STOP_SECONDS = 2.0


class Maintenance:
    def __init__(self, identity: str) -> None:
        self.identity = identity
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobs-maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        next_sweep = 0.0
        outage = OutageLog("outbox relay / janitor", logger)
        try:
            while not self._stop.is_set():
                busy = False
                try:
                    busy = (
                        outbox.relay_once(self.identity, concurrency=outbox.RELAY_CONCURRENCY) > 0
                    )
                    if time.monotonic() >= next_sweep:
                        janitor.sweep(self.identity)
                        next_sweep = time.monotonic() + janitor.interval_seconds()
                    outage.recovered()
                except DatabaseError as exc:
                    outage.failed(exc)
                    connection.close()
                except Exception:  # noqa: BLE001  keep relaying; the rows keep the truth
                    logger.exception("outbox relay / janitor failed; retrying")
                    connection.close()
                if not busy:
                    self._stop.wait(jobs_settings().POLL_SECONDS)
        finally:
            connection.close()
