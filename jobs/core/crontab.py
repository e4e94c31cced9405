"""Cron expressions evaluated in a time zone: whether one is usable, and its ticks in UTC.

Owns: the arithmetic (croniter) and its daylight-saving rules, shared by @handler(cron=...)
(jobs.core.registry) and the schedules (jobs.ops.cron). Never: touches the database or reads
the clock -- callers pass the moment to count from.

Daylight saving follows Vixie cron:
  spring forward  a tick in the skipped hour runs at the first minute after the gap (02:30 on a
                  spring-forward day in Paris runs at 03:00 local)
  fall back       a fixed-time expression (its minute and hour fields hold neither `*` nor a
                  step: "30 2 * * *", "0,30 1-3 * * *") runs once in the repeated hour, on its
                  first pass; an interval-like one ("*/5 * * * *", "0 * * * *", "*/20 2 * * *",
                  @hourly) runs in both passes, as its interval of elapsed time says

Hazards: croniter.is_valid accepts expressions that never fire ("0 0 30 2 *", "0 0 31 4 *", a
year field in the past): asking for their next tick raises CroniterBadDateError, a ValueError.
`check` asks for it, so such an expression is refused where it is declared, not where it runs.
croniter also accepts a field it draws at random ("R", "R(0-30)", "R/15"), drawn afresh by each
iterator: the ticks the scheduler counts at each step would disagree ("R R * * *", once a day,
ran about twice a day), so `check` refuses it too.
"""

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from jobs.core.exceptions import InvalidOption

MAX_CHARS = 200
# croniter's aliases; only @hourly is interval-like (every hour, like "0 * * * *")
_ALIAS_FIXED = {"@hourly": False}
# a whole field croniter draws at random (its hash_expression_re, type "r"; a name such as MAR
# or FRI is no match, and croniter refuses "r" inside a list)
_RANDOM_FIELD = re.compile(r"r(?:\(\d+-\d+\))?(?:/\d+)?", re.ASCII | re.IGNORECASE)
# Keys of the zone database that name whatever zone the machine reading them is set to (Debian's
# tzdata has both): a schedule in one would tick at other hours on a web server and a worker set
# differently, and move when a machine's setting changes.
_THIS_MACHINES = frozenset({"localtime", "posixrules"})


def check(cron: object, timezone: object, now: datetime) -> None:
    """Raise InvalidOption (a ValueError) saying why, unless `cron` is an expression that fires
    after `now` in the known time zone `timezone`."""
    if not isinstance(cron, str) or len(cron) > MAX_CHARS or not croniter.is_valid(cron):
        raise InvalidOption(f"{cron!r} is not a cron expression")
    if any(_RANDOM_FIELD.fullmatch(field) for field in cron.split()):
        raise InvalidOption(
            f"{cron!r} has a field croniter draws at random (R): its ticks would change each "
            "time they are counted; write the value instead"
        )
    if isinstance(timezone, str) and timezone in _THIS_MACHINES:
        raise InvalidOption(
            f"time zone {timezone!r} is whatever zone each machine is set to: name the zone "
            "(e.g. 'Europe/Paris', 'UTC')"
        )
    try:
        ZoneInfo(timezone)  # type: ignore[arg-type]
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidOption(f"unknown time zone {timezone!r}") from None
    try:
        next_tick(cron, timezone, now)  # type: ignore[arg-type]
    except ValueError:  # CroniterBadDateError: no such date (30 February), or only in the past
        raise InvalidOption(
            f"{cron!r} never fires (no date after {now:%Y-%m-%d} matches it)"
        ) from None


def is_fixed_time(cron: str) -> bool:
    """Whether `cron` names wall-clock times (no `*` and no step in its minute and hour
    fields): such a tick runs once when the fall-back repeats its hour."""
    words = cron.split()
    if len(words) == 1:
        return _ALIAS_FIXED.get(words[0].lower(), True)
    return not any("*" in field or "/" in field for field in words[:2])


def ticks_after(cron: str, tz: str, after: datetime) -> Iterator[datetime]:
    """The cron's ticks strictly after `after`, oldest first, in UTC."""
    return _ticks(cron, tz, after, forward=True)


def ticks_before(cron: str, tz: str, before: datetime) -> Iterator[datetime]:
    """The cron's ticks strictly before `before`, newest first, in UTC."""
    return _ticks(cron, tz, before, forward=False)


def next_tick(cron: str, tz: str, after: datetime) -> datetime:
    return next(ticks_after(cron, tz, after))


def _ticks(cron: str, tz: str, start: datetime, *, forward: bool) -> Iterator[datetime]:
    zone = ZoneInfo(tz)
    once_when_repeated = is_fixed_time(cron)
    it = croniter(cron, start.astimezone(zone))
    step = it.get_next if forward else it.get_prev
    while True:
        tick = step(datetime).astimezone(UTC)
        if once_when_repeated and _second_pass(tick.astimezone(zone)):
            continue
        yield tick


def _second_pass(local: datetime) -> bool:
    """`local` is a wall-clock time the fall-back repeats, on its second pass (zoneinfo sets
    fold=1 there; the offset check keeps that meaning should a zone set it elsewhere)."""
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()
