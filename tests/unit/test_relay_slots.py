"""The relay's slots (jobs/effects/slots.py): the open threads take any lane up to PER_LANE; the
reserved ones only a lane with no slow call, one call of it at a time; a lane is slow while a
call of it has been out SLOW_SECONDS, and for SLOW_MEMORY after. On a clock the test moves."""

from jobs.effects import slots
from jobs.effects.slots import Plan, Slots


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _slots(clock: Clock, threads: int = 8, reserved: int = 2) -> Slots:
    return Slots(threads, 2, reserved, slow_seconds=2.0, slow_memory=600.0, clock=clock)


def test_the_open_threads_are_the_threads_less_the_reserved_ones():
    s = _slots(Clock())
    assert s.plan(reserved=False) == Plan(6, 2, {})
    assert s.plan(reserved=True) == Plan(2, 1, {})
    for lane in ("a", "a", "b"):
        s.start(lane)
    assert s.plan(reserved=False) == Plan(3, 2, {"a": 2, "b": 1})
    # A full lane and a lane already in a reserved thread are shut out of the reserved ones.
    s.start("c", reserved=True)
    assert s.plan(reserved=True) == Plan(1, 1, {"a": 1, "c": 1})
    assert s.plan(reserved=False).limit == 3  # a reserved call takes no open thread
    assert s.in_flight() == {"a": 2, "b": 1, "c": 1}


def test_a_lane_whose_call_is_out_past_the_threshold_is_slow_and_shut_out_of_the_reserve():
    clock = Clock()
    s = _slots(clock)
    handle = s.start("hanging")
    quick = s.start("quick")
    clock.now += 1.9
    assert s.slow() == set()
    assert s.plan(reserved=True).busy == {}
    s.end(quick)
    clock.now += 0.1
    assert s.slow() == {"hanging"}
    assert s.plan(reserved=True).busy == {"hanging": 1}
    assert s.plan(reserved=False) == Plan(5, 2, {"hanging": 1})  # the open ones: any lane
    s.end(handle)  # cut at its deadline: still remembered slow
    clock.now += 599.0
    assert s.slow() == {"hanging"}
    clock.now += 2.0
    assert s.slow() == set()


def test_a_call_that_ended_after_the_threshold_makes_its_lane_slow():
    clock = Clock()
    s = _slots(clock)
    quick, slow = s.start("a"), s.start("b")
    clock.now += 0.5
    s.end(quick)
    clock.now += 1.5
    s.end(slow)  # never seen by a plan while out, 2 s in all
    assert s.slow() == {"b"}
    assert s.in_flight() == {}


def test_at_most_max_slow_lanes_are_remembered_the_oldest_forgotten_first():
    clock = Clock()
    s = _slots(clock)
    for n in range(slots.MAX_SLOW + 3):
        handle = s.start(f"lane-{n}")
        clock.now += 2.0
        s.end(handle)
    remembered = s.slow()
    assert len(remembered) == slots.MAX_SLOW
    assert "lane-0" not in remembered and f"lane-{slots.MAX_SLOW + 2}" in remembered


def test_a_relay_of_few_threads_keeps_at_least_one_open():
    assert _slots(Clock(), threads=1).plan(reserved=False).limit == 1
    assert _slots(Clock(), threads=1).plan(reserved=True).limit == 0
    assert _slots(Clock(), threads=2).plan(reserved=True).limit == 1


def test_a_call_given_up_on_frees_its_thread_but_still_fills_its_lane():
    s = _slots(Clock(), threads=3, reserved=1)
    hung = s.start("hanging")
    s.start("hanging")
    s.abandon(hung)
    assert s.plan(reserved=False) == Plan(1, 2, {"hanging": 2})  # one thread back, lane full
    assert "hanging" in s.slow()  # and kept out of the reserve
    s.end(hung)
    assert s.plan(reserved=False) == Plan(1, 2, {"hanging": 1})


def test_calls_given_up_on_past_the_cap_take_threads_again(monkeypatch):
    monkeypatch.setattr(slots, "MAX_ABANDONED", 2)
    s = _slots(Clock(), threads=8, reserved=0)
    for lane in "abc":
        s.abandon(s.start(lane))
    assert s.plan(reserved=False).limit == 7  # the third one holds a thread: no unbounded pile
