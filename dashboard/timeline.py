"""The attempt timeline's geometry: one bar per attempt on a shared time axis.

Owns: turning a job's attempts, events and rejected writes into positions (percent of the axis)
that the template draws as absolutely positioned boxes. Never: queries or writes.

A bar runs from the claim to the attempt's end as the job saw it (commit, failure, expiry); if the
attempt's worker kept going as a zombie, a dashed tail runs on to its last rejected write -- which
is where two attempts visibly overlap. Boundaries (claim, expiry, commit, failure, rejection, ...)
are always drawn; minor marks (heartbeats, checkpoints) are collapsed into one counted mark per
percent of the axis, so a job with thousands of beats still draws a readable timeline.
"""

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Model
from django.utils import timezone

from jobs.models import Attempt, Job, JobEvent, RejectedWrite

MINOR_TYPES = frozenset({"heartbeat", "checkpoint", "progress"})
AXIS_TICKS = 5
LATEST = datetime.max.replace(tzinfo=UTC)  # the last instant a datetime can hold


def _later(at: datetime, by: timedelta) -> datetime:
    """`at + by`, held at LATEST: a row written by raw SQL may sit in the year 9999, where the
    sum would overflow and the job's page could not open."""
    return at + min(by, LATEST - at)


def iso_ms(at: datetime | None) -> str:
    """ISO 8601 with milliseconds in the server's time zone (settings.TIME_ZONE), "" for None.

    The server's zone, not the active one: the dashboard activates none, and looking the active
    one up (`timezone.localtime`) cost two thirds of this function, which a job page with 50
    attempts calls about a thousand times."""
    if at is None:
        return ""
    return at.astimezone(timezone.get_default_timezone()).isoformat(timespec="milliseconds")


@functools.cache
def _labels(model: type[Model], field: str) -> dict[Any, Any]:
    choices: Any = model._meta.get_field(field)
    return dict(choices.flatchoices)


def display(obj: Model, field: str) -> str:
    """`obj.get_<field>_display()` from a map made once per field: Django's flattens the field's
    choices again on every call (a few hundred calls on a long job's page)."""
    value = getattr(obj, field)
    return str(_labels(type(obj), field).get(value, value))


@dataclass
class Marker:
    pos: float  # percent of the axis
    kind: str  # css class suffix: an event type, "rejected", "heartbeat"
    label: str
    at: datetime
    count: int = 1
    event: JobEvent | None = None  # its label is made only if the mark is drawn

    @functools.cached_property
    def at_iso(self) -> str:  # drawn twice per mark (its title and data-at)
        return iso_ms(self.at)

    @property
    def title(self) -> str:
        if self.count > 1:
            return f"{self.count} {self.kind}s around {self.at_iso}"
        if self.label:
            return self.label
        return _event_label(self.event) if self.event else f"{self.kind} at {self.at_iso}"


@dataclass
class Bar:
    attempt: Attempt
    left: float
    width: float
    won: bool
    tail_left: float = 0.0
    tail_width: float = 0.0
    markers: list[Marker] = field(default_factory=list)
    worker_died: bool = False  # ended by a rescue: its worker process died, no lease ran out


@dataclass
class Timeline:
    start: datetime
    end: datetime
    bars: list[Bar]
    ticks: list[tuple[float, str]]

    @property
    def overlaps(self) -> bool:
        spans = sorted((b.left, b.left + b.width + b.tail_width) for b in self.bars)
        return any(nxt[0] < cur[1] for cur, nxt in zip(spans, spans[1:], strict=False))


class _Axis:
    def __init__(self, start: datetime, end: datetime) -> None:
        self.start = start
        self.span = max((end - start).total_seconds(), 0.001)

    def pos(self, at: datetime) -> float:
        return round(min(max((at - self.start).total_seconds() / self.span, 0.0), 1.0) * 100, 3)


def _collapse(markers: list[Marker]) -> list[Marker]:
    """Keep every boundary mark; fold minor marks into one per percent, counted."""
    kept = [m for m in markers if m.kind not in MINOR_TYPES]
    bins: dict[tuple[str, int], Marker] = {}
    for m in (m for m in markers if m.kind in MINOR_TYPES):
        key = (m.kind, int(m.pos))
        if key in bins:
            bins[key].count += m.count
        else:
            bins[key] = Marker(m.pos, m.kind, m.label, m.at, m.count, event=m.event)
    return sorted(kept + list(bins.values()), key=lambda m: m.pos)


def _event_label(e: JobEvent) -> str:
    worker = f" by {e.worker}" if e.worker else ""
    return f"{display(e, 'type')} (attempt {e.attempt}){worker} at {iso_ms(e.at)}"


def _rescued(e: JobEvent) -> bool:
    """An `expired` event a rescue wrote (selectors annotate `rescued` from its data)."""
    return e.type == "expired" and bool(getattr(e, "rescued", False))


def _event_marker(e: JobEvent, axis: _Axis) -> Marker:
    if not _rescued(e):
        return Marker(axis.pos(e.at), e.type, "", e.at, event=e)
    by = f" by {e.worker}" if e.worker else ""
    label = (
        f"Worker process died: attempt {e.attempt} reclaimed at once{by} at {iso_ms(e.at)} "
        "(not a lease expiry)"
    )
    return Marker(axis.pos(e.at), "worker-exited", label, e.at)


def _rejected_label(r: RejectedWrite) -> str:
    return (
        f"Stale {display(r, 'write').lower()} rejected: attempt {r.attempt_presented} presented, "
        f"{r.attempt_current} current, by {r.worker} at {iso_ms(r.at)}"
    )


def bounds(
    attempts: list[Attempt],
    events: Iterable[JobEvent],
    rejected: list[RejectedWrite],
    now: datetime,
    minor_last: datetime | None = None,
) -> tuple[datetime, datetime] | None:
    """The axis: from the first claim to the last thing drawn (an end, an event, a rejected
    write, the newest minor mark `minor_last`), plus 2 % of room (less at the end of the
    calendar: `_later`). None without attempts. selectors.minor_marks bins heartbeats on this
    same axis before build() draws it."""
    if not attempts:
        return None
    stamps = [a.claimed_at for a in attempts] + [e.at for e in events if e.type != "rejected"]
    stamps += [r.at for r in rejected] + [a.ended_at or now for a in attempts]
    if minor_last is not None:
        stamps.append(minor_last)
    start = min(a.claimed_at for a in attempts)
    end = max(stamps)
    return start, _later(end, max((end - start) * 0.02, timedelta(milliseconds=5)))


def build(
    job: Job,
    attempts: list[Attempt],
    events: Iterable[JobEvent],
    rejected: list[RejectedWrite],
    now: datetime | None = None,
    minor: Iterable[tuple[int, str, datetime] | tuple[int, str, datetime, int]] = (),
    lease_seconds: float | None = None,
) -> Timeline | None:
    """`events` are model rows (any type); `minor` are heartbeats and checkpoints as (attempt,
    type, at) tuples, or already binned as (attempt, type, at, count) by selectors.minor_marks
    (a long job has thousands). With `lease_seconds`, an expired attempt also shows where its
    lease ran out (its last heartbeat plus the lease), apart from the reclaim."""
    if not attempts:
        return None
    now = now or timezone.now()
    events = [e for e in events if e.type != "rejected"]  # drawn from RejectedWrite instead
    minor_by_attempt: dict[int, list[tuple[str, datetime, int]]] = {}
    for attempt, type_, at, *count in minor:
        minor_by_attempt.setdefault(attempt, []).append((type_, at, count[0] if count else 1))
    last = max((at for beats in minor_by_attempt.values() for _, at, _ in beats), default=None)
    span = bounds(attempts, events, rejected, now, last)
    assert span is not None
    start, end = span
    axis = _Axis(start, end)
    by_attempt: dict[int, list[JobEvent]] = {}
    for e in events:
        by_attempt.setdefault(e.attempt, []).append(e)
    bars = [
        _bar(
            job,
            a,
            by_attempt.get(a.number, []),
            minor_by_attempt.get(a.number, []),
            rejected,
            axis,
            now,
        )
        for a in attempts
    ]
    if lease_seconds:
        for bar in bars:
            _mark_lease_deadline(bar, lease_seconds, axis)
    ticks = [
        (round(i * 100 / (AXIS_TICKS - 1), 3), iso_ms(start + (end - start) * i / (AXIS_TICKS - 1)))
        for i in range(AXIS_TICKS)
    ]
    return Timeline(start, end, bars, ticks)


def _bar(
    job: Job,
    a: Attempt,
    events: list[JobEvent],  # this attempt's own
    minor: list[tuple[str, datetime, int]],  # this attempt's heartbeats/checkpoints: type, at, n
    rejected: list[RejectedWrite],
    axis: _Axis,
    now: datetime,
) -> Bar:
    ended = a.ended_at or now
    left, right = axis.pos(a.claimed_at), axis.pos(ended)
    mine = [r for r in rejected if r.attempt_presented == a.number]
    markers = [_event_marker(e, axis) for e in events]
    markers += [Marker(axis.pos(at), type_, "", at, n) for type_, at, n in minor]  # lazy labels
    if a.heartbeat_at and a.heartbeat_at != a.claimed_at:
        label = f"Last heartbeat of attempt {a.number} at {iso_ms(a.heartbeat_at)}"
        markers.append(Marker(axis.pos(a.heartbeat_at), "heartbeat", label, a.heartbeat_at))
    markers += [Marker(axis.pos(r.at), "rejected", _rejected_label(r), r.at) for r in mine]
    bar = Bar(a, left, max(right - left, 0.4), won=_won(job, a), markers=_collapse(markers))
    bar.worker_died = a.outcome == "expired" and any(_rescued(e) for e in events)
    last_write = max((r.at for r in mine), default=None)
    if last_write and last_write > ended:
        bar.tail_left, bar.tail_width = right, max(axis.pos(last_write) - right, 0.2)
    return bar


def _mark_lease_deadline(bar: Bar, lease_seconds: float, axis: _Axis) -> None:
    a = bar.attempt
    expiry = next((m for m in bar.markers if m.kind == "expired"), None)
    if expiry is None:
        return
    deadline = _later(a.heartbeat_at or a.claimed_at, timedelta(seconds=lease_seconds))
    if deadline <= expiry.at:
        label = f"Lease of attempt {a.number} ran out about {iso_ms(deadline)} (last beat + lease)"
        bar.markers.append(Marker(axis.pos(deadline), "lease-deadline", label, deadline))
        bar.markers.sort(key=lambda m: m.pos)


def _won(job: Job, a: Attempt) -> bool:
    return job.state == "succeeded" and job.attempt == a.number and a.outcome == "succeeded"
