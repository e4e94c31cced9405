"""System checks for operations: reaper slower than the lease, SQLite without WAL, bad cron."""

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from jobs.core.conf import JobsSettings


def _ids(**overrides):
    with override_settings(**overrides):
        return {m.id for m in run_checks()}


def _jobs(**values):
    return {**settings.JOBS, **values}


def test_a_reaper_slower_than_the_lease_is_refused():
    assert "jobs.E011" in _ids(JOBS=_jobs(LEASE_SECONDS=30.0, REAPER_SECONDS=45.0))
    assert "jobs.E011" not in _ids(JOBS=_jobs(LEASE_SECONDS=30.0, REAPER_SECONDS=1.0))


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_sqlite_without_wal_is_refused():
    db = {**settings.DATABASES["default"]}
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"}
    no_wal = {**sqlite, "OPTIONS": {"init_command": "PRAGMA synchronous=NORMAL;"}}
    wal = {**sqlite, "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;"}}
    assert "jobs.E012" in _ids(DATABASES={"default": db, "other": no_wal})
    assert "jobs.E012" not in _ids(DATABASES={"default": db, "other": wal})


def test_an_invalid_schedule_is_refused_with_its_reason():
    with override_settings(
        JOBS_SCHEDULES={
            "bad-cron": {"kind": "test.echo", "cron": "every minute"},
            "bad-kind": {"kind": "no.such", "cron": "* * * * *"},
            "bad-zone": {"kind": "test.echo", "cron": "* * * * *", "timezone": "Mars/Olympus"},
            "good": {"kind": "test.echo", "cron": "*/5 * * * *"},
        }
    ):
        messages = [m for m in run_checks() if m.id == "jobs.E010"]
    text = " ".join(m.msg for m in messages)
    assert len(messages) == 3
    assert "bad-cron" in text and "bad-kind" in text and "Mars/Olympus" in text
    assert "'good'" not in text


def test_the_defaults_pass():
    assert JobsSettings().REAPER_SECONDS <= JobsSettings().LEASE_SECONDS
    assert not {"jobs.E010", "jobs.E011", "jobs.E012"} & _ids()


@pytest.mark.django_db(transaction=True)
def test_a_fenced_row_table_without_its_commit_check_is_a_database_warning():
    from django.db import connection

    from jobs.effects import fenced

    def w040() -> list[str]:
        return [m.msg for m in run_checks(databases=["default"]) if m.id == "jobs.W040"]

    assert w040() == []
    with connection.cursor() as cur:
        cur.execute("DROP TRIGGER jobs_fence_at_commit ON demo_report")
    try:
        assert [m.split(":")[0] for m in w040()] == ["demo.Report"]
        assert not [m for m in run_checks() if m.id == "jobs.W040"]  # only with --database
    finally:
        fenced.install_commit_checks()
    assert w040() == []
