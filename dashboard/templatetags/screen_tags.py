"""Template filters of the queues and cron pages: relative times and ages.

`reltime` renders a <time> holding the exact moment to the millisecond (shown as is without
JavaScript, and as its title); static/dashboard/keys.js rewrites its text as "12 s ago" /
"in 3 min" and keeps it ticking, so the exact value stays one hover away.
"""

from datetime import datetime

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from dashboard.timeline import iso_ms

register = template.Library()


@register.filter
def reltime(at: datetime | None) -> SafeString | str:
    if at is None:
        return "–"
    exact = iso_ms(at)
    return format_html(
        '<time class="rel" datetime="{}" data-at="{}" title="{}">{}</time>',
        at.isoformat(),
        int(at.timestamp() * 1000),
        exact,
        exact,
    )


@register.filter
def age(seconds: float | None) -> str:
    """A duration for people: "850 ms", "42.0 s", "3 min 12 s", "2 h 5 min"."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


@register.filter
def oldest_age(queue: object, now: datetime) -> str:
    """How long the queue's oldest due job has waited, at `now` (the database clock)."""
    return age(queue.oldest_due_age(now))  # type: ignore[attr-defined]
