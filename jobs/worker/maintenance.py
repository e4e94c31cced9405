"""The outbox relay and the orphan janitor, each on a thread of its own beside the scheduler.

Owns: when the relay pumps (jobs/effects/relay.py: claims what its per-target slots allow, never
waits for a call) and when the janitor sweeps (every janitor.interval_seconds(), on its own
thread: a slow storage backend never delays an intent, a hanging target never delays a sweep).
Never: runs on the scheduler's own thread -- a slow webhook or storage backend must not delay the
lease reaper or drain dispatch.

Hazards: each thread has its own database connection (Django's are per thread) and closes it on
exit and after any database error; a database outage is logged once, then reminded, then its
recovery (jobs.core.connectivity.OutageLog), any other error -- a SystemExit too, not an interrupt
-- with its traceback, and the loop goes on after a pause. Both tasks are safe with several
schedulers at once (SKIP LOCKED claims, fenced marks). Their round trips are not under the
platform's deadline (a storage backend may rightly be slow; a webhook call has its own total
deadline); libpq's keepalives bound a dead peer, and a stop never waits longer than STOP_SECONDS
(daemon threads: the process exits without them). The relay's calls still out at a stop keep
their intents claimed while the process lives (the handlers' shutdown grace): a daemon thread of
the relay's renews them (Relay.keep_claims).
"""

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, connection

from jobs.core.conf import jobs_settings
from jobs.core.connectivity import OutageLog
from jobs.effects import janitor
from jobs.effects.relay import Relay

logger = logging.getLogger("jobs.maintenance")

STOP_SECONDS = 2.0


class Maintenance:
    def __init__(self, identity: str) -> None:
        self.identity = identity
        self._stop = threading.Event()
        self.relay = Relay(identity)
        self._threads = [
            threading.Thread(target=self._relay, name="jobs-relay", daemon=True),
            threading.Thread(target=self._janitor, name="jobs-janitor", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        self._stop.set()
        self.relay.freed.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        # The process may live on for its handlers' grace: calls still out keep their claims.
        self.relay.keep_claims()

    def _loop(self, name: str, step: Callable[[], float]) -> None:
        """Run `step` until stopped; it returns how long to wait before the next run."""
        outage = OutageLog(name, logger)
        try:
            while not self._stop.is_set():
                pause = jobs_settings().POLL_SECONDS
                try:
                    pause = step()
                    outage.recovered()
                except DatabaseError as exc:
                    outage.failed(exc)
                    connection.close()
                except KeyboardInterrupt:
                    raise
                except BaseException:  # noqa: BLE001  keep going; the rows keep the truth
                    # A SystemExit (say) from code the step calls too: ending the thread would
                    # stop this process's relay, or janitor, for every row while the rest runs.
                    logger.exception("%s failed; retrying", name)
                    connection.close()
                if pause > 0:
                    self._stop.wait(pause)
        finally:
            connection.close()

    def _relay(self) -> None:
        def pump() -> float:
            if self.relay.pump():
                return 0.0
            # Nothing claimable: wait for a call to end (a slot), the next poll, or a call's
            # deadline or lease renewal (an overdue call's claim is kept by pump()).
            self.relay.wait(jobs_settings().POLL_SECONDS)
            return 0.0

        self._loop("outbox relay", pump)

    def _janitor(self) -> None:
        def sweep() -> float:
            janitor.sweep(self.identity)
            return janitor.interval_seconds()

        self._loop("orphan janitor", sweep)
