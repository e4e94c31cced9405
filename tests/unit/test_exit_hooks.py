"""Exit hooks (jobs.core.registry): what a process ending through os._exit runs first -- a
timed-out worker (jobs.worker.watchdog), a worker abandoning its handler when a stop's grace is
over (jobs.worker.runner), qcluster's main process. jobs.tasks sends its queued notices there."""

import logging

import pytest

from jobs.core import registry
from jobs.tasks import execution


@pytest.fixture
def hooks(monkeypatch):
    monkeypatch.setattr(registry, "_exit_hooks", [])
    return registry._exit_hooks


def test_every_hook_runs_once_and_one_that_raises_stops_none_of_the_others(hooks, caplog):
    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise RuntimeError("boom")

    for hook in (lambda: ran.append("first"), broken, lambda: ran.append("last")):
        registry.add_exit_hook(hook)
    registry.add_exit_hook(broken)  # once only
    with caplog.at_level(logging.ERROR, logger="jobs.registry"):
        registry.before_exit()
    assert ran == ["first", "broken", "last"]
    assert [r.message for r in caplog.records] == ["an exit hook failed"]


def test_the_tasks_layer_sends_its_queued_notices_before_an_exit():
    assert execution.send_queued_before_exit in registry._exit_hooks
    assert execution.EXIT_WAIT_SECONDS == registry.EXIT_HOOK_SECONDS
