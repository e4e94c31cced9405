"""Cron in a time zone across daylight saving (jobs/core/crontab.py), as Vixie cron does it: a
fixed-time expression runs once in the hour the fall-back repeats, an interval-like one in both
passes; forward and backward walks agree. Found in review: "30 2 * * *" in Paris ran twice on
2026-10-25 (00:30 and 01:30 UTC)."""

from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest

from jobs.core import crontab
from jobs.core.exceptions import InvalidOption


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def between(cron: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    ticks = []
    for t in crontab.ticks_after(cron, tz, start):
        if t >= end:
            return ticks
        ticks.append(t)
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("tz", "cron", "day", "once"),
    [
        ("Europe/Paris", "30 2 * * *", utc(2026, 10, 24, 22), utc(2026, 10, 25, 0, 30)),
        ("Europe/Paris", "0 2 * * *", utc(2026, 10, 24, 22), utc(2026, 10, 25, 0, 0)),
        ("America/New_York", "30 1 * * *", utc(2026, 11, 1, 4), utc(2026, 11, 1, 5, 30)),
        ("Australia/Lord_Howe", "45 1 * * *", utc(2026, 4, 4, 13), utc(2026, 4, 4, 14, 45)),
        ("America/Santiago", "30 23 * * *", utc(2026, 4, 4, 20), utc(2026, 4, 5, 2, 30)),
    ],
)
def test_a_fixed_time_tick_runs_once_when_the_fall_back_repeats_its_hour(
    tz: str, cron: str, day: datetime, once: datetime
) -> None:
    assert between(cron, tz, day, day + timedelta(hours=12)) == [once]


@pytest.mark.parametrize(
    ("cron", "ticks"),
    [
        ("*/30 * * * *", 4),  # 02:00 02:30 summer time, then 02:00 02:30 winter time
        ("0 * * * *", 2),
        ("@hourly", 2),
        ("*/30 2 * * *", 4),
        ("0,30 2 * * *", 2),  # fixed: once
        ("0 0-23 * * *", 1),
    ],
)
def test_interval_like_ticks_run_in_both_passes_of_the_repeated_hour(cron: str, ticks: int) -> None:
    # 00:00-02:00 UTC on 2026-10-25 is Paris's 02:00-02:59, twice
    assert (
        len(between(cron, "Europe/Paris", utc(2026, 10, 24, 23, 59), utc(2026, 10, 25, 2))) == ticks
    )


def test_a_spring_forward_tick_still_runs_at_the_first_minute_after_the_gap() -> None:
    assert crontab.next_tick("30 2 * * *", "Europe/Paris", utc(2026, 3, 28, 12)) == utc(
        2026, 3, 29, 1
    )


@pytest.mark.parametrize("cron", ["30 2 * * *", "*/30 * * * *", "0,30 0-3 * * *", "30 1 * * *"])
@pytest.mark.parametrize(
    ("tz", "start"),
    [
        ("Europe/Paris", utc(2026, 10, 24, 20)),
        ("Europe/Paris", utc(2026, 3, 28, 20)),
        ("America/New_York", utc(2026, 10, 31, 20)),
        ("Australia/Lord_Howe", utc(2026, 4, 4, 10)),
    ],
)
def test_walking_back_finds_the_ticks_walking_forward_found(
    cron: str, tz: str, start: datetime
) -> None:
    forward = list(islice(crontab.ticks_after(cron, tz, start), 12))
    assert forward == sorted(set(forward))
    back = list(islice(crontab.ticks_before(cron, tz, forward[-1] + timedelta(seconds=1)), 12))
    assert back[::-1] == forward


@pytest.mark.parametrize("cron", ["R R * * *", "r * * * *", "0 R(1-5) * * *", "R/15 * * * *"])
def test_a_field_croniter_draws_at_random_is_refused_where_it_is_declared(cron: str) -> None:
    # croniter draws an `R` field afresh for each iterator, and the scheduler counts a schedule's
    # ticks with a new one at every step (next_at, the walk, the tick after): "R R * * *", once a
    # day at a random time, was enqueued 60 times in 30 days. Found in review.
    with pytest.raises(InvalidOption, match="random"):
        crontab.check(cron, "UTC", utc(2026, 12, 1))


@pytest.mark.parametrize("cron", ["0 0 * MAR *", "0 0 * * FRI", "0 0 * APR,OCT SAT", "@hourly"])
def test_names_holding_an_r_are_not_taken_for_a_random_field(cron: str) -> None:
    crontab.check(cron, "UTC", utc(2026, 12, 1))


@pytest.mark.parametrize("zone", ["localtime", "posixrules"])
def test_a_zone_key_naming_the_machines_own_zone_is_refused(zone: str) -> None:
    # ZoneInfo("localtime") reads /usr/share/zoneinfo/localtime (Debian: the machine's zone): a
    # schedule in it would tick at other hours on machines set differently. Found in review.
    with pytest.raises(InvalidOption, match="each machine"):
        crontab.check("0 9 * * *", zone, utc(2026, 12, 1))


@pytest.mark.parametrize("zone", [["UTC"], {"key": "UTC"}])
def test_a_time_zone_that_is_no_text_is_an_invalid_option_not_a_type_error(zone: object) -> None:
    # The check for the machine's own zone looked an unhashable value up in a set: a TypeError
    # escaped where InvalidOption (a ValueError) is promised. Found in second review.
    with pytest.raises(InvalidOption, match="unknown time zone"):
        crontab.check("0 9 * * *", zone, utc(2026, 12, 1))
