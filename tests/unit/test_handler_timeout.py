"""`@handler(timeout=...)`: held to its range at registration; the attempt's limit comes from it."""

import pytest
from django.test import override_settings

import jobs
from jobs import handler
from jobs.core.registry import get_handler
from jobs.worker.runner import _timeout_for


@pytest.mark.parametrize("timeout", [0, 0.1, -1, 1e13, float("nan"), "60", True])
def test_an_out_of_range_timeout_is_refused_at_registration(timeout):
    with pytest.raises(jobs.InvalidOption, match="timeout"):
        handler("test.never_registered_timeout", timeout=timeout)


def test_a_kinds_timeout_wins_over_q_timeout():
    assert get_handler("test.timeout_in_c").timeout == 1.5
    assert _timeout_for(get_handler("test.timeout_in_c")) == 1.5


@override_settings(Q_CLUSTER={"timeout": 42})
def test_without_its_own_timeout_a_kind_gets_q_timeout():
    assert _timeout_for(get_handler("test.echo")) == 42.0
