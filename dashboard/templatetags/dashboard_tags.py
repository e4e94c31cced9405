"""Template filters of the dashboard: millisecond timestamps, sparklines, durations."""

from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape

from django import template
from django.db.models import Model
from django.template.defaultfilters import truncatechars
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from dashboard import timeline
from dashboard.selectors import EVENT_DATA_CHARS
from dashboard.timeline import Bar, Marker, iso_ms
from jobs.models import Attempt, JobEvent, RejectedWrite

register = template.Library()


@register.filter
def ms(at: datetime | None) -> str:
    """ISO 8601 with milliseconds, in the server's time zone ("" for None)."""
    return iso_ms(at)


@register.filter
def display(obj: Model, field: str) -> str:
    """`{{ obj|display:"field" }}`: the label of a choices field, as `obj.get_<field>_display`
    gives it, from a map made once per field (see dashboard.timeline.display)."""
    return timeline.display(obj, field)


@register.filter
def sparkline(values: list[int], size: str = "120x24") -> str:
    """SVG polyline points for `values` in a box of `size` ("WxH")."""
    width, height = (int(n) for n in size.split("x"))
    if not values:
        return ""
    top = max(max(values), 1)
    step = width / max(len(values) - 1, 1)
    return " ".join(
        f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(values)
    )


@register.filter
def seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.3f} s"


@register.filter
def total(values: list[int]) -> int:
    return sum(values)


@register.filter
def epoch_ms(at: datetime | None) -> str:
    """Milliseconds since the epoch, for the client-side countdowns (data-deadline, data-since)."""
    return "" if at is None else str(int(at.timestamp() * 1000))


@register.filter
def get_item(mapping: dict, key: str) -> object:
    return mapping.get(key)


LANE = (
    '<div class="lane" data-attempt="{n}">\n'
    '    <span class="lane-label">#{n} <small>{worker}</small></span>\n'
    '    <div class="track">\n'
    '      <div class="bar outcome-{outcome}{won}" style="left: {left}%; width: {width}%"'
    ' title="attempt {n}: {shown}; claimed {claimed}{ended}">'
    '<span class="bar-label">{shown}{commit}</span></div>\n'
    "      {tail}{marks}\n"
    "    </div>\n"
    "  </div>"
)
TAIL = (
    '<div class="tail" style="left: {}%; width: {}%"'
    ' title="attempt {} kept running as a zombie"></div>'
)


def _mark(m: Marker) -> str:
    count = f"<b>{int(m.count)}</b>" if m.count > 1 else ""  # a number, never text
    return (
        f'<span class="mark mark-{escape(m.kind)}" style="left: {float(m.pos)}%" '
        f'title="{escape(m.title)}" data-at="{escape(m.at_iso)}">{count}</span>'
    )


@register.simple_tag
def timeline_lane(bar: Bar) -> SafeString:
    """One attempt's lane of the timeline: its bar, zombie tail and marks. Built here, not by
    template loops: a long job draws 50 lanes and hundreds of marks, and the template engine's
    per-variable lookups cost more than all the rest of its page. Every text is escaped
    (html.escape, as Django's escape does); numbers are formatted as plain floats and ints (a
    CSS length is never localized)."""
    a = bar.attempt
    marks = "".join(_mark(m) for m in bar.markers)
    ended = format_html(", ended {}", iso_ms(a.ended_at)) if a.ended_at else ""
    tail = format_html(TAIL, bar.tail_left, bar.tail_width, a.number) if bar.tail_width else ""
    return format_html(
        LANE,
        n=a.number,
        worker=a.worker,
        outcome=a.outcome,
        won=" won" if bar.won else "",
        left=bar.left,
        width=bar.width,
        shown=(
            f"{timeline.display(a, 'outcome')}: worker process died"
            if bar.worker_died
            else timeline.display(a, "outcome")
        ),
        claimed=iso_ms(a.claimed_at),
        ended=ended,
        commit=" · commit won" if bar.won else "",
        tail=tail,
        marks=mark_safe(marks),  # noqa: S308 -- every part escaped by _mark
    )


# The job page's tables, row by row (its rows are most of the page's template lookups). Each
# cell is what `{{ value }}` would print -- str() of the value, escaped as Django escapes -- and
# the markup is the template's that these replaced.


def _cell(value: object) -> str:
    """`{{ value }}`: a SafeString (format_html's) as it is, anything else str() and escaped."""
    if isinstance(value, SafeString):
        return value
    return escape(value if isinstance(value, str) else str(value))


def _rows(rows: Iterable[tuple[str, Sequence[object]]]) -> SafeString:
    """`<tr class=...>` rows of `<td>` cells: the one place these tables are marked safe."""
    html = "".join(
        f'<tr class="{_cell(css)}">' + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>"
        for css, cells in rows
    )
    return mark_safe(html)  # noqa: S308 -- every class and cell escaped by _cell


@register.simple_tag
def attempt_rows(attempts: list[Attempt]) -> SafeString:
    error = '<details><summary>{}</summary><pre class="error">{}</pre></details>'
    return _rows(
        (
            f"outcome-{a.outcome}",
            [
                a.number,
                a.worker,
                timeline.display(a, "outcome"),
                iso_ms(a.claimed_at),
                iso_ms(a.heartbeat_at),
                iso_ms(a.ended_at),
                format_html(error, truncatechars(a.error, 80), a.error) if a.error else "",
            ],
        )
        for a in attempts
    )


@register.simple_tag
def rejected_rows(rejected: list[RejectedWrite]) -> SafeString:
    return _rows(
        (
            "rejected",
            [
                iso_ms(r.at),
                timeline.display(r, "write"),
                r.attempt_presented,
                r.attempt_current,
                timeline.display(r, "state_current"),
                r.worker,
                r.resource or "job row",
            ],
        )
        for r in rejected
    )


@register.simple_tag
def event_rows(events: list[JobEvent]) -> SafeString:
    return _rows(
        (
            f"ev-{e.type}",
            [
                e.pk,
                iso_ms(e.at),
                e.attempt,
                timeline.display(e, "type"),
                e.worker,
                format_html("<code>{}</code>", _event_data(e)),
            ],
        )
        for e in events
    )


def _event_data(event: JobEvent) -> str:
    """The data as the database gives its text (selectors read it so, never decoded), cut."""
    text: str = getattr(event, "data_text", None) or ""
    if len(text) > EVENT_DATA_CHARS:
        return f"{text[:EVENT_DATA_CHARS]}… (the first {EVENT_DATA_CHARS:,} characters)"
    return text
