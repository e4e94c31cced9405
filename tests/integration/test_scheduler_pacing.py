"""Under a stream of enqueues the embedded scheduler ticks at most every TICK_SPACING_SECONDS.

Every enqueue notifies. The scheduler woke for each notification and ticked again at once -- a
due count, a broker count and an unresolved-writes check per tick -- so the faster its tick, the
more of the database's time a stream spent on it. The notifications that arrive during the
spacing wake one tick.
"""

import threading
import time

import pytest
from django.db import connection  # noqa: F401  (the skipif condition)

from jobs.core.sql.queues import ENQUEUED_CHANNEL
from jobs.worker import scheduler
from tests.wake import NoMaintenance

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="LISTEN/NOTIFY"),
]

TICKS = 8


def test_a_stream_of_notifications_wakes_ticks_no_closer_than_the_spacing(
    monkeypatch: pytest.MonkeyPatch, second_connection
) -> None:  # type: ignore[no-untyped-def]
    ticks: list[float] = []
    monkeypatch.setattr(scheduler, "Maintenance", NoMaintenance)
    monkeypatch.setattr(
        scheduler.EmbeddedScheduler, "tick", lambda self: ticks.append(time.monotonic())
    )
    sched = scheduler.EmbeddedScheduler()
    done = threading.Event()
    thread = threading.Thread(target=sched.run, args=(done.is_set,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    sent = 0
    try:
        # notify without pause until the scheduler has ticked TICKS times (or the deadline)
        while len(ticks) < TICKS and time.monotonic() < deadline:
            second_connection.execute("SELECT pg_notify(%s, 'default')", [ENQUEUED_CHANNEL])
            sent += 1
    finally:
        done.set()
        thread.join(10)
    assert len(ticks) >= TICKS, ticks
    gaps = [b - a for a, b in zip(ticks[1:TICKS], ticks[2:TICKS], strict=False)]
    # the first two ticks: the start, then the fresh LISTEN's own wake-up
    assert min(gaps) >= scheduler.TICK_SPACING_SECONDS * 0.95, gaps
    assert sent > 10 * TICKS  # a stream: many notifications per tick
