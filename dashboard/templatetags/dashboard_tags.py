"""Template filters of the dashboard: millisecond timestamps, sparklines, durations."""

from datetime import datetime

from django import template

from dashboard.timeline import iso_ms

register = template.Library()


@register.filter
def ms(at: datetime | None) -> str:
    """ISO 8601 with milliseconds, in the server's time zone ("" for None)."""
    return iso_ms(at)


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
