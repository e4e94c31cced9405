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


def test_check_refuses_a_drain_not_below_the_django_q_timeout():
    q = {"timeout": 60, "retry": 120, "max_attempts": 1, "ack_failures": True}
    assert "jobs.E006" in _ids(JOBS={"DRAIN_SECONDS": 60}, Q_CLUSTER=q)
    assert "jobs.E006" not in _ids(JOBS={"DRAIN_SECONDS": 59}, Q_CLUSTER=q)


@pytest.mark.parametrize(
    "value", [{"CLAIM_BATCH": 0}, {"LEASE_SECONDS": 1e13}, {"MAX_ATTEMPTS": 10**6}]
)
def test_check_refuses_a_jobs_value_out_of_its_range(value):
    assert "jobs.E001" in _ids(JOBS=value)


def test_the_documented_defaults():
    """docs/operations.md's table and docs/design.md name these defaults."""
    with override_settings(JOBS={}):
        cfg = jobs_settings()
        assert (cfg.CLAIM_BATCH, cfg.LEASE_SECONDS, cfg.DRAIN_SECONDS) == (64, 30.0, 10.0)
        assert (cfg.INTENT_RETRY_HOURS, cfg.IDLE_WAIT_SECONDS, cfg.REAPER_SECONDS) == (
            24.0,
            10.0,
            1,
        )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LEASE_SECONDS", "30s", "JOBS_LEASE_SECONDS = '30s' is not a float"),
        ("LEASE_SECONDS", "nan", "JOBS_LEASE_SECONDS = nan is outside"),
        ("CLAIM_BATCH", "0", "JOBS_CLAIM_BATCH = 0 is outside [1, 1000]"),
    ],
)
def test_a_bad_environment_override_is_named_by_its_variable(monkeypatch, name, value, message):
    """The operator set JOBS_<KEY>, not JOBS[<KEY>]: jobs.E001 names what to change."""
    monkeypatch.setenv(f"JOBS_{name}", value)
    jobs_settings.cache_clear()
    try:
        errors = [m.msg for m in run_checks() if m.id == "jobs.E001"]
    finally:
        monkeypatch.delenv(f"JOBS_{name}")
        jobs_settings.cache_clear()
    assert errors and errors[0].startswith(message), errors


@pytest.mark.parametrize("value", [1.5, True, 7.25])
def test_a_whole_number_setting_refuses_a_fraction_or_a_flag(value):
    # int() made CLAIM_BATCH 1.5 a silent 1 and True a 1.
    with (
        override_settings(JOBS={"CLAIM_BATCH": value}),
        pytest.raises(ValueError, match=r"JOBS\['CLAIM_BATCH'\] = .* is not a whole number"),
    ):
        jobs_settings()


def test_a_whole_number_setting_takes_an_integral_float():
    with override_settings(JOBS={"CLAIM_BATCH": 8.0}):
        assert jobs_settings().CLAIM_BATCH == 8


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        # a TypeError / AttributeError from inside, which no check caught (manage.py check died)
        ({"QUEUES": 5}, r"JOBS\['QUEUES'\] must be a list of queue names"),
        ({"QUEUES": ["mail", 5]}, r"JOBS\['QUEUES'\] must be a list of queue names"),
        # names no job can carry: the workers served nothing, silently
        ({"QUEUES": ["bad name"]}, r"JOBS\['QUEUES'\] 'bad name' is not a queue name"),
        ({"QUEUES": "mail,a\x00"}, r"JOBS\['QUEUES'\] 'a\\x00' is not a queue name"),
        # accepted here, then every enqueue raised InvalidOption
        ({"ENQUEUE_PREPARE": "maybe"}, r"JOBS\['ENQUEUE_PREPARE'\] = 'maybe': use 'auto'"),
        # str(None) made the storage alias 'None'; the first staged output failed its job
        ({"STAGING_STORAGE": None}, r"JOBS\['STAGING_STORAGE'\] = None is not text"),
        ({"STAGING_STORAGE": "nowhere"}, r"JOBS\['STAGING_STORAGE'\] = 'nowhere' is not a key"),
        ({"LISTEN_URL": 5}, r"JOBS\['LISTEN_URL'\] = 5 is not text"),
        ({"UNRESOLVED_DIR": "var/\x00"}, r"JOBS\['UNRESOLVED_DIR'\] .* holds a NUL"),
    ],
)
def test_a_text_or_list_setting_that_cannot_work_is_refused_by_name(jobs, message):
    with override_settings(JOBS=jobs), pytest.raises(ValueError, match=message):
        jobs_settings()
    assert "jobs.E001" in _ids(JOBS=jobs)


def test_the_enqueue_prepare_values_are_the_ones_the_enqueue_takes():
    from jobs.core.conf import ENQUEUE_PREPARE_VALUES
    from jobs.models.prepared import CHOICES

    assert set(CHOICES) == ENQUEUE_PREPARE_VALUES


def test_the_queue_names_settings_take_are_the_ones_enqueue_takes():
    from jobs.core import bounds
    from jobs.core.enqueue import QUEUE_NAME

    assert QUEUE_NAME is bounds.QUEUE_NAME


def test_a_path_setting_may_be_a_path(tmp_path):
    with override_settings(JOBS={"UNRESOLVED_DIR": tmp_path / "unresolved"}):
        assert jobs_settings().UNRESOLVED_DIR == str(tmp_path / "unresolved")
