"""When the runner must stop starting jobs: a held lease unextended for half its length.

The clock is the heartbeat module's monotonic clock, set by the test (no sleeps, no database).
"""

import pytest

from jobs.core.transitions import Fence
from jobs.worker import heartbeat
from jobs.worker.heartbeat import Heartbeater


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(heartbeat.time, "monotonic", c)
    return c


def beats(clock: Clock) -> Heartbeater:
    return Heartbeater(interval=10.0, commit=lambda items: None)  # never started: no thread


def test_a_short_lease_claimed_long_after_the_last_beat_is_fresh(clock):
    hb = beats(clock)
    hb.hold(Fence(1, 1, "w:1"), 30.0)
    clock.now += 3.0  # a 3 s job ran; no beat yet (interval 10 s)
    hb.hold(Fence(2, 1, "w:1"), 2.0)  # the drill's 2 s lease, just set by its claim
    assert not hb.at_risk
    clock.now += 1.1  # still no beat: the 2 s lease is now half gone
    assert hb.at_risk


def test_a_long_lease_unbeaten_for_half_its_length_is_at_risk(clock):
    hb = beats(clock)
    hb.hold(Fence(1, 1, "w:1"), 30.0)
    clock.now += 14.0
    assert not hb.at_risk
    clock.now += 2.0
    assert hb.at_risk


def test_nothing_held_is_never_at_risk(clock):
    hb = beats(clock)
    clock.now += 1000.0
    assert not hb.at_risk
