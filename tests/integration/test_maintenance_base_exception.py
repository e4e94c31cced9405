"""A BaseException from a maintenance step ends that run of the step, not its thread: the relay
and the janitor are each one thread for the whole process, and a SystemExit that ended one
(threading ignores it without a word) stopped every row's delivery, or every sweep, for good."""

from typing import Any

import pytest

from jobs.effects import janitor
from jobs.worker.maintenance import Maintenance
from tests.slow_receivers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class _Library(BaseException):
    """What a library may raise that is not an Exception."""


@pytest.mark.parametrize("raised", [SystemExit(3), _Library("its own")])
def test_a_base_exception_in_a_sweep_does_not_end_the_janitor(monkeypatch, caplog, raised):
    calls: list[str] = []

    def sweep(identity: str, *args: Any, **kwargs: Any) -> int:
        calls.append(identity)
        if len(calls) == 1:
            raise raised
        return 0

    monkeypatch.setattr(janitor, "sweep", sweep)
    monkeypatch.setattr(janitor, "interval_seconds", lambda: 0.01)
    maintenance = Maintenance("maintenance-base-exception")
    maintenance.start()
    try:
        wait_for(lambda: len(calls) >= 2, 15, "the janitor's thread ended with the exception")
    finally:
        maintenance.stop()
    assert "orphan janitor failed; retrying" in caplog.text
