"""The timeline's geometry: overlap visible, boundaries kept, minor marks collapsed."""

from datetime import UTC, datetime, timedelta

from dashboard import timeline
from jobs.models import Attempt, Job, JobEvent, RejectedWrite

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_zombie_tail_makes_attempts_one_and_two_overlap() -> None:
    job = Job(pk=1, state="succeeded", attempt=2)
    attempts = [
        Attempt(
            job_id=1, number=1, worker="a:1", claimed_at=at(0), ended_at=at(2), outcome="expired"
        ),
        Attempt(
            job_id=1, number=2, worker="b:2", claimed_at=at(3), ended_at=at(6), outcome="succeeded"
        ),
    ]
    stale = RejectedWrite(
        job_id=1,
        attempt_presented=1,
        attempt_current=2,
        worker="a:1",
        write="commit",
        state_current="succeeded",
        at=at(7),
    )
    line = timeline.build(job, attempts, [], [stale], now=at(8))
    assert line is not None and line.overlaps
    first, second = line.bars
    assert first.tail_width > 0 and first.tail_left + first.tail_width > second.left
    assert "rejected" in [m.kind for m in first.markers]
    assert second.won and not first.won


def test_thousands_of_minor_marks_collapse_but_every_boundary_stays() -> None:
    job = Job(pk=1, state="running", attempt=50)
    attempts = [
        Attempt(
            job_id=1,
            number=n,
            worker="w:1",
            claimed_at=at(n * 10),
            ended_at=at(n * 10 + 9) if n < 50 else None,
            outcome="expired" if n < 50 else "running",
        )
        for n in range(1, 51)
    ]
    events = [JobEvent(job_id=1, attempt=n, type="claimed", at=at(n * 10)) for n in range(1, 51)]
    events += [
        JobEvent(job_id=1, attempt=50, type="heartbeat", at=at(500 + i / 1000)) for i in range(5000)
    ]
    line = timeline.build(job, attempts, events, [], now=at(510))
    assert line is not None and len(line.bars) == 50
    last = line.bars[-1]
    beats = [m for m in last.markers if m.kind == "heartbeat"]
    assert len(beats) <= 101 and sum(m.count for m in beats) == 5000
    assert all(any(m.kind == "claimed" for m in bar.markers) for bar in line.bars)


def test_unknown_outcome_and_event_values_render_generically() -> None:
    job = Job(pk=1, state="queued", attempt=1)
    attempts = [
        Attempt(
            job_id=1, number=1, worker="w", claimed_at=at(0), ended_at=at(1), outcome="released"
        )
    ]
    events = [JobEvent(job_id=1, attempt=1, type="released", at=at(1))]
    line = timeline.build(job, attempts, events, [], now=at(2))
    assert line is not None
    assert line.bars[0].markers[0].kind == "released"
    assert "released" in line.bars[0].markers[0].title.lower()


def test_an_expired_attempt_shows_where_its_lease_ran_out_before_the_reclaim() -> None:
    job = Job(pk=1, state="running", attempt=2)
    attempts = [
        Attempt(
            job_id=1,
            number=1,
            worker="a:1",
            claimed_at=at(0),
            heartbeat_at=at(1),
            ended_at=at(4),
            outcome="expired",
        ),
        Attempt(job_id=1, number=2, worker="b:2", claimed_at=at(4.1), outcome="running"),
    ]
    events = [JobEvent(job_id=1, attempt=1, type="expired", at=at(4))]
    line = timeline.build(job, attempts, events, [], now=at(5), lease_seconds=2)
    assert line is not None
    kinds = [m.kind for m in line.bars[0].markers]
    assert kinds.index("lease-deadline") < kinds.index("expired")
    deadline = next(m for m in line.bars[0].markers if m.kind == "lease-deadline")
    assert deadline.at == at(3)


def test_a_lease_deadline_past_the_end_of_the_calendar_is_held_at_its_last_instant() -> None:
    job = Job(pk=1, state="running", attempt=2)
    last = timeline.LATEST - timedelta(seconds=1)
    attempts = [
        Attempt(
            job_id=1, number=1, worker="a:1", claimed_at=last, heartbeat_at=last,
            ended_at=last, outcome="expired",
        ),
        Attempt(job_id=1, number=2, worker="b:2", claimed_at=last, outcome="running"),
    ]  # fmt: skip
    events = [JobEvent(job_id=1, attempt=1, type="expired", at=timeline.LATEST)]
    line = timeline.build(job, attempts, events, [], now=last, lease_seconds=30)
    assert line is not None and line.end == timeline.LATEST
    deadline = next(m for m in line.bars[0].markers if m.kind == "lease-deadline")
    assert deadline.at == timeline.LATEST
