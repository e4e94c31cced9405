import pytest
from django.core.checks import run_checks
from django.test import override_settings

from jobs.core.conf import jobs_settings


def test_environment_overrides_a_jobs_setting(monkeypatch):
    monkeypatch.setenv("JOBS_LEASE_SECONDS", "7.5")
    jobs_settings.cache_clear()
    try:
        assert jobs_settings().LEASE_SECONDS == 7.5
    finally:
        monkeypatch.delenv("JOBS_LEASE_SECONDS")
        jobs_settings.cache_clear()


def test_queues_are_read_from_a_comma_separated_list(monkeypatch):
    monkeypatch.setenv("JOBS_QUEUES", "mail, render")
    jobs_settings.cache_clear()
    try:
        assert jobs_settings().QUEUES == ("mail", "render")
    finally:
        monkeypatch.delenv("JOBS_QUEUES")
        jobs_settings.cache_clear()


def test_an_unknown_jobs_key_is_an_error():
    with (
        override_settings(JOBS={"LEASE_SECONDZ": 3}),
        pytest.raises(ValueError, match="LEASE_SECONDZ"),
    ):
        jobs_settings()


def _ids(**settings):
    with override_settings(**settings):
        return {m.id for m in run_checks()}


def test_check_refuses_a_heartbeat_longer_than_a_third_of_the_lease():
    assert "jobs.E003" in _ids(JOBS={"LEASE_SECONDS": 6, "HEARTBEAT_SECONDS": 3})


def test_check_refuses_a_django_q_timeout_not_below_retry():
    assert "jobs.E002" in _ids(Q_CLUSTER={"timeout": 60, "retry": 60})


def test_the_shipped_settings_pass_every_check():
    assert not {i for i in _ids() if i.startswith("jobs.")}
