"""Server-side SVG charts with axes: per-minute series drawn on a time axis, no JavaScript.

Owns: the geometry of a chart (scales, ticks, polylines, hover columns) as plain values; the
template `dashboard/chart.html` draws them (the hover columns come as SVG from `hover_svg`,
built with format_html), so every label is escaped.
Never: queries -- callers pass the per-minute values (dashboard/queues.py, the overview).

Hover: each minute is one transparent column whose SVG `<title>` names the minute and every
series' value with its unit (the browser shows it as a tooltip; a test reads it).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

WIDTH, HEIGHT = 420, 150
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 20, 22  # margins for the axes' labels
X_TICKS_EVERY = 15  # minutes between two labelled ticks of the time axis


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float]
    css: str  # the stroke's class: ok, bad, fence, run, warn


@dataclass(frozen=True)
class Column:
    x: str  # SVG coordinates, formatted once here (the template never localizes a number)
    width: str
    title: str


@dataclass(frozen=True)
class Tick:
    at: str  # the coordinate along its axis
    label: str


@dataclass
class Chart:
    title: str
    unit: str  # "jobs/min", "%"
    minutes: list[datetime]  # the start of each bucket, oldest first
    series: list[Series]
    fixed_max: float | None = None  # e.g. 100 for a percentage
    chart_id: str = ""
    width: int = WIDTH
    height: int = HEIGHT
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # css, points, name
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lines, self.y_ticks, self.x_ticks, self.columns = _layout(self)

    @property
    def plot(self) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of the plotting area, in SVG units."""
        return LEFT, TOP, self.width - RIGHT, self.height - BOTTOM

    @property
    def box(self) -> dict[str, int]:
        """The plotting area and the places of the axes' labels, for the template."""
        left, top, right, bottom = self.plot
        return {
            "left": left,
            "top": top,
            "right": right,
            "bottom": bottom,
            "height": bottom - top,
            "y_label_x": left - 4,
            "x_label_y": bottom + 15,
            "tick_end": bottom + 4,
        }

    @property
    def hover_svg(self) -> SafeString:
        """The hover columns as SVG, built here in one pass (the template's loop over 60 columns
        cost more than the rest of the queues page); format_html escapes each title."""
        top, height = TOP, self.height - BOTTOM - TOP
        return format_html_join(
            "",
            '<rect x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>',
            ((c.x, top, c.width, height, c.title) for c in self.columns),
        )

    @property
    def totals(self) -> list[tuple[str, float, str]]:
        return [(s.name, _number(sum(s.values)), s.css) for s in self.series]


def nice_max(value: float) -> float:
    """The top of the value axis: four times the smallest step of 1, 2, (2.5,) 5 x 10^n (at
    least 1) that reaches `value`, so each of the four gridlines falls on a whole, round number."""
    wanted = max(value, 1) / 4
    magnitude = 10 ** math.floor(math.log10(wanted)) if wanted >= 1 else 1
    for step in (1, 2, 2.5, 5, 10) if magnitude >= 10 else (1, 2, 5, 10):  # whole steps
        if step * magnitude >= wanted:
            return float(4 * step * magnitude)
    return float(40 * magnitude)  # pragma: no cover - the loop always returns


def _number(value: float) -> float:
    return round(value, 1) if value != int(value) else int(value)


def _clock(at: datetime) -> str:
    return timezone.localtime(at).strftime("%H:%M")


def _layout(
    chart: Chart,
) -> tuple[list[tuple[str, str, str]], list[Tick], list[Tick], list[Column]]:
    left, top, right, bottom = chart.plot
    n = max(len(chart.minutes), 1)
    top_value = chart.fixed_max or nice_max(
        max((v for s in chart.series for v in s.values), default=0)
    )
    step = (right - left) / max(n - 1, 1)

    def y(v: float) -> float:
        return bottom - (min(v, top_value) / top_value) * (bottom - top)

    lines = [
        (
            s.css,
            " ".join(f"{left + i * step:.1f},{y(v):.1f}" for i, v in enumerate(s.values)),
            s.name,
        )
        for s in chart.series
    ]
    y_ticks = [
        Tick(f"{y(top_value * k / 4):.1f}", f"{_number(top_value * k / 4):g}") for k in range(5)
    ]
    x_ticks = [
        Tick(f"{left + i * step:.1f}", _clock(at))
        for i, at in enumerate(chart.minutes)
        if i == n - 1 or (n - 1 - i) % X_TICKS_EVERY == 0
    ]
    columns = [
        Column(
            f"{max(left + (i - 0.5) * step, left):.1f}",
            f"{step if 0 < i < n - 1 else step / 2:.1f}",
            f"{_clock(at)} · "
            + ", ".join(f"{s.name} {_number(s.values[i]):g} {chart.unit}" for s in chart.series),
        )
        for i, at in enumerate(chart.minutes)
    ]
    return lines, y_ticks, x_ticks, columns


def minutes_until(now: datetime, count: int) -> list[datetime]:
    """The starts of the last `count` minutes, the current (partial) minute last."""
    current = now.replace(second=0, microsecond=0)
    return [current - timedelta(minutes=k) for k in range(count - 1, -1, -1)]


def overview_charts(
    now: datetime, succeeded: list[int], failed: list[int], rejected: list[int]
) -> list[Chart]:
    """The overview's per-minute series (oldest first, the last one the current minute)."""
    minutes = minutes_until(now, len(succeeded))
    return [
        Chart(
            "Finished jobs",
            "jobs/min",
            minutes,
            [Series("succeeded", succeeded, "ok"), Series("failed", failed, "bad")],
            chart_id="chart-finished",
        ),
        Chart(
            "Rejected stale writes",
            "writes/min",
            minutes,
            [Series("rejected", rejected, "fence")],
            chart_id="chart-rejected",
        ),
    ]
