"""A target that raises SystemExit (a library calling sys.exit()), or another BaseException that
is not a stop (KeyboardInterrupt, GeneratorExit), fails its own intent's try -- recorded like any
other error whose outcome is unknown: backoff, failures counted, given up after the retry
horizon -- and the relay goes on with the other rows.

Before, `outbox.handle` caught `Exception` only: the SystemExit left `relay_once` with the rest
of its batch still claimed, and ended the embedded relay's call thread silently (threading
drops a SystemExit) with nothing recorded -- the intent stayed `performing` until its 60 s lease
ran out, no failure counted, no `last_error`, so never given up after the retry horizon."""

import asyncio
import time

import pytest

from jobs.effects import outbox, relay
from jobs.models import Intent
from tests.integration.attempts import commit_intent

pytestmark = pytest.mark.django_db(transaction=True)


class _Stop(BaseException):
    """A library's own BaseException (not a stop of this process)."""


RAISED = [SystemExit(3), SystemExit("bye"), _Stop("custom"), asyncio.CancelledError()]
IDS = ["SystemExit-3", "SystemExit-text", "custom-BaseException", "CancelledError"]


class _Raises:
    def __init__(self, exc: BaseException, where: str = "perform") -> None:
        self.exc, self.where, self.performed, self.checked = exc, where, 0, 0

    def perform(self, key: str, data: object, token: int) -> None:
        self.performed += 1
        if self.where == "perform" or self.performed == 1:
            raise self.exc if self.where == "perform" else TimeoutError("answer lost")

    def reconcile(self, key: str, data: object, token: int) -> bool:
        self.checked += 1
        raise self.exc


class _Fine:
    def __init__(self) -> None:
        self.performed = 0

    def perform(self, key: str, data: object, token: int) -> None:
        self.performed += 1


@pytest.mark.parametrize("exc", RAISED, ids=IDS)
def test_a_perform_raising_a_base_exception_is_its_intents_failed_try(exc):
    outbox.register_target("test-exits", _Raises(exc))
    fine = _Fine()
    outbox.register_target("test-fine", fine)
    exits, other = commit_intent("test-exits"), commit_intent("test-fine")

    assert outbox.relay_once("relay-a") == 2  # before: SystemExit left here, `other` unhandled
    row = Intent.objects.get(key=exits)
    assert (row.state, row.outcome_unknown, row.failures) == ("pending", True, 1)
    assert row.lease_expires_at is None and row.next_try_at is not None
    assert row.last_error.startswith(type(exc).__name__)
    assert Intent.objects.get(key=other).state == "done" and fine.performed == 1


@pytest.mark.parametrize("exc", RAISED[:1] + RAISED[2:3], ids=IDS[:1] + IDS[2:3])
def test_a_reconcile_raising_a_base_exception_is_asked_again_later(exc):
    target = _Raises(exc, where="reconcile")
    outbox.register_target("test-exits", target)
    key = commit_intent("test-exits")
    assert outbox.relay_once("relay-a") == 1  # performed, its answer lost: unknown
    Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")  # its backoff has passed
    assert outbox.relay_once("relay-a") == 1
    row = Intent.objects.get(key=key)
    assert (row.state, row.outcome_unknown, row.failures) == ("pending", True, 2)
    assert row.last_error.startswith(f"reconciliation: {type(exc).__name__}")
    assert (target.performed, target.checked) == (1, 1)  # never performed again blind


def test_a_perform_raising_system_exit_past_the_retry_horizon_is_given_up():
    outbox.register_target("test-exits", _Raises(SystemExit(1)))
    key = commit_intent("test-exits")
    Intent.objects.update(retry_since="2000-01-01T00:00:00Z")
    assert outbox.relay_once("relay-a") == 1
    row = Intent.objects.get(key=key)
    assert (row.state, row.outcome_unknown, row.failures) == ("failed", True, 1)
    assert row.last_error.startswith("SystemExit")


def test_the_embedded_relay_records_a_system_exit_and_delivers_the_other_intents():
    outbox.register_target("test-exits", _Raises(SystemExit(0)))
    fine = _Fine()
    outbox.register_target("test-fine", fine)
    exits = commit_intent("test-exits")
    others = [commit_intent("test-fine") for _ in range(3)]
    pool = relay.Relay("relay-exits", threads=2, per_lane=4, reserved=0)

    # Well under the relay's 60 s lease: before, the SystemExit's row waited for it to run out.
    deadline = time.monotonic() + 10
    while Intent.objects.filter(state="performing").exists() or Intent.objects.filter(
        key__in=others
    ).exclude(state="done"):
        assert time.monotonic() < deadline, list(Intent.objects.values("key", "state"))
        if not pool.pump():
            pool.freed.wait(0.05)
    row = Intent.objects.get(key=exits)
    assert (row.state, row.failures, row.outcome_unknown) == ("pending", 1, True)
    assert row.last_error.startswith("SystemExit") and fine.performed == 3
    assert pool.in_flight() == {}  # every call's slot freed


def test_a_keyboard_interrupt_from_a_target_is_still_a_stop():
    outbox.register_target("test-exits", _Raises(KeyboardInterrupt()))
    commit_intent("test-exits")
    with pytest.raises(KeyboardInterrupt):
        outbox.relay_once("relay-a")
