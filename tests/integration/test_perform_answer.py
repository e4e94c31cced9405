"""A target's `perform()` says "performed" by returning None and anything else by raising
(`Refused`: certainly not performed; any other exception: the outcome is unknown). Before, its
return value was not read: a perform that answered its failure -- False, an HTTP client's
response to a 500 (false), an error text or dict -- had its intent marked `done`, never
performed. A value other than None now breaks the contract as an exception would: the outcome
is unknown (reconciled at the next try, never performed again blind), and the row says why."""

import pytest

import jobs
from jobs.effects import outbox
from jobs.models import Intent
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)


class _Response:
    """What `requests.post(url)` returns: false for a status of 400 or more."""

    def __init__(self, status: int) -> None:
        self.status_code = status

    def __bool__(self) -> bool:
        return self.status_code < 400


class _Target:
    def __init__(self, answer: object, found: bool | None) -> None:
        self.answer, self.found, self.performed, self.checked = answer, found, 0, 0

    def perform(self, key: str, data: object, token: int) -> object:
        self.performed += 1
        return self.answer if self.performed == 1 else None

    def reconcile(self, key: str, data: object, token: int) -> bool | None:
        self.checked += 1
        return self.found


def _relayed(target: object, name: str = "test-perform-answer") -> Intent:
    """A committed intent for `target` (registered as `name`), after the relay's first try."""
    outbox.register_target(name, target)
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", name, {})
    running.commit(None)
    assert outbox.relay_once("relay-a") == 1
    return Intent.objects.get()


@pytest.mark.parametrize(
    "answer",
    [False, _Response(500), "error: quota exceeded", {"ok": False}, 0, 1.0],
    ids=["False", "response-500", "text", "dict", "0", "1.0"],
)
def test_a_perform_that_returns_a_value_leaves_its_outcome_unknown_never_done(answer):
    target = _Target(answer, found=False)
    row = _relayed(target)
    assert (row.state, row.outcome_unknown, row.performs) == ("pending", True, 1)
    assert f"perform() returned a {type(answer).__name__}, not None" in row.last_error
    assert "a failed perform must raise" in row.last_error

    Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")  # its backoff has passed
    assert outbox.relay_once("relay-a") == 1  # reconciled first: proved not performed
    row = Intent.objects.get()
    assert (target.checked, target.performed) == (1, 2)
    assert (row.state, row.outcome_unknown, row.reconciled) == ("done", False, False)


def test_a_perform_that_returns_a_value_to_a_target_that_cannot_check_is_parked():
    target = _Target(False, found=None)
    row = _relayed(target)
    Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")
    outbox.relay_once("relay-a")
    row = Intent.objects.get()
    assert (row.state, row.outcome_unknown, target.performed) == ("failed", True, 1)


@pytest.mark.parametrize("answer", [None, True], ids=["None", "True"])
def test_a_perform_that_returns_none_or_true_is_performed(answer):
    # `return response.ok` on success is a common way to write a target: True says performed.
    row = _relayed(_Target(answer, found=None))
    assert (row.state, row.outcome_unknown, row.performs) == ("done", False, 1)


class _ApiError(Exception):
    """An API client's error whose message is built from fields it may lack: str() raises."""

    def __str__(self) -> str:
        raise KeyError("message")


class _Unreadable:
    def __init__(self, where: str) -> None:
        self.where, self.performed = where, 0

    def perform(self, key: str, data: object, token: int) -> None:
        self.performed += 1
        if self.where == "perform" or self.performed == 1:
            raise (_ApiError() if self.where == "perform" else TimeoutError("answer lost"))

    def reconcile(self, key: str, data: object, token: int) -> bool:
        raise _ApiError()


@pytest.mark.parametrize("where", ["perform", "reconcile"])
def test_an_error_whose_message_cannot_be_read_is_recorded_as_its_intents_try(where):
    # Before, str(exc) raised inside the relay's bookkeeping: the try was never recorded (no
    # backoff, no failures counted, no last_error, so never given up after the retry horizon),
    # the intent stayed claimed until its lease ran out, and relay_once's batch ended there.
    target = _Unreadable(where)
    _relayed(target, "test-unreadable")
    if where == "reconcile":  # the first call's answer was lost: the next try reconciles
        Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")
        assert outbox.relay_once("relay-a") == 1
    row = Intent.objects.get()
    assert (row.state, row.outcome_unknown, row.lease_expires_at) == ("pending", True, None)
    assert row.failures == (1 if where == "perform" else 2)
    assert "_ApiError" in row.last_error and target.performed == 1
