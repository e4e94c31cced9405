"""A target's `reconcile()` answers True (performed), False (not performed, and a lower token
never will be) or None (it cannot check). Any other value proves nothing: it is "cannot tell
yet", asked again with backoff. Before, the relay read the answer by its truth value: a falsy
object -- an HTTP client's response to a 500, whose bool() is False; a 0; an empty dict -- was
taken for "not performed" and the intent performed again at a target that had performed it,
and a truthy one ({"found": False}) closed an intent that had never been performed."""

import pytest

import jobs
from jobs.effects import outbox
from jobs.models import Intent
from tests.integration.attempts import claim

pytestmark = pytest.mark.django_db(transaction=True)


class _Response:
    """What `requests.get(check_url)` returns: false for a status of 400 or more."""

    def __init__(self, status: int) -> None:
        self.status_code = status

    def __bool__(self) -> bool:
        return self.status_code < 400

    def __repr__(self) -> str:
        return f"<Response [{self.status_code}]>"


class _Target:
    def __init__(self, answer: object) -> None:
        self.answer, self.performed = answer, 0

    def perform(self, key: str, data: object, token: int) -> None:
        self.performed += 1
        if self.performed == 1:
            raise TimeoutError("the answer was lost: performed, unknown to the relay")

    def reconcile(self, key: str, data: object, token: int) -> object:
        return self.answer


@pytest.mark.parametrize("answer", [_Response(500), 0, "", {}, {"found": False}, "no", 1], ids=repr)
def test_a_reconcile_answer_other_than_true_false_or_none_is_cannot_tell_yet(answer):
    target = _Target(answer)
    outbox.register_target("test-answer", target)
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", "test-answer", {})
    running.commit(None)

    assert outbox.relay_once("relay-a") == 1  # performed; its answer lost: unknown
    Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")  # its backoff has passed
    assert outbox.relay_once("relay-a") == 1  # reconciled: the answer proves nothing

    row = Intent.objects.get()
    assert target.performed == 1  # never performed again on that answer
    assert (row.state, row.outcome_unknown, row.reconciled) == ("pending", True, False)
    assert "True, False or None" in row.last_error


@pytest.mark.parametrize(("answer", "state", "performed"), [(True, "done", 1), (False, "done", 2)])
def test_true_closes_the_intent_and_false_performs_it_again(answer, state, performed):
    target = _Target(answer)
    outbox.register_target("test-answer", target)
    jobs.enqueue("test.echo")
    running = claim("host-a:1")
    running.ctx.intent("publish", "test-answer", {})
    running.commit(None)
    outbox.relay_once("relay-a")
    Intent.objects.update(next_try_at="2000-01-01T00:00:00Z")
    outbox.relay_once("relay-a")
    row = Intent.objects.get()
    assert (row.state, row.reconciled, target.performed) == (state, answer, performed)
