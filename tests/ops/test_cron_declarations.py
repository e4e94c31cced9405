"""What a declaration must be to become a schedule, and that a bad one stops no other. Found in
review: croniter.is_valid accepts expressions that never fire; `manage.py check` was silent
about them and sync() then raised for every schedule (and qcluster with it)."""

from datetime import UTC, datetime

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from jobs.core.exceptions import InvalidOption
from jobs.core.registry import handler
from jobs.models import Schedule
from jobs.ops import cron as schedules

T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
FINE = {"kind": "test.echo", "cron": "*/15 * * * *"}
# 30 February, 31 April, and a year long gone: valid to croniter, yet no date matches them
NEVER = ["0 0 30 2 *", "0 0 31 4 *", "* * * * * * 2020"]


def e010(declared: dict[str, object]) -> list[str]:
    with override_settings(JOBS_SCHEDULES=declared):
        return [m.msg for m in run_checks() if m.id == "jobs.E010"]


@pytest.mark.parametrize("cron", NEVER)
def test_a_cron_that_never_fires_is_a_check_error_naming_the_schedule(cron: str) -> None:
    errors = e010({"never": {"kind": "test.echo", "cron": cron}, "fine": FINE})
    assert len(errors) == 1, errors
    assert errors[0].startswith("schedule 'never': ") and "never fires" in errors[0]


@pytest.mark.django_db
@pytest.mark.parametrize("cron", NEVER)
def test_sync_skips_a_cron_that_never_fires_and_syncs_the_others(cron: str) -> None:
    with override_settings(
        JOBS_SCHEDULES={"never": {"kind": "test.echo", "cron": cron}, "fine": FINE}
    ):
        schedules.sync(T0)
    assert list(Schedule.objects.values_list("name", flat=True)) == ["fine"]


@pytest.mark.parametrize("cron", NEVER)
def test_a_handler_whose_cron_never_fires_is_refused_where_it_is_declared(cron: str) -> None:
    with pytest.raises(InvalidOption, match="never fires"):
        handler("test.never_registered", cron=cron)


def test_a_cron_that_fires_only_in_leap_years_is_accepted() -> None:
    assert e010({"leap": {"kind": "test.echo", "cron": "0 0 29 2 *"}}) == []


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["night\x00ly", "night\ud800ly"])
def test_a_name_the_database_cannot_store_is_refused_and_the_others_sync(name: str) -> None:
    declared = {name: {"kind": "test.echo", "cron": "0 3 * * *"}, "fine": FINE}
    errors = e010(declared)
    assert len(errors) == 1 and ("NUL" in errors[0] or "surrogate" in errors[0]), errors
    with override_settings(JOBS_SCHEDULES=declared):
        schedules.sync(T0)  # raised DataError for every schedule
    assert list(Schedule.objects.values_list("name", flat=True)) == ["fine"]
