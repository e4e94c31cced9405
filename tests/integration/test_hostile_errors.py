"""A handler's exception is a hostile value: one whose str() raises (an AssertionError subclass
here, which the runner asks whether it is multiprocessing's "daemonic processes" refusal) fails
its own job; its batch-mates run. Before, the hint's str(exc) raised inside the runner's
classification: the drain ended, its batch handed back, and the job came back to do it again.
So does one whose own code raises while its traceback is formatted (a `__getattr__` raising
KeyError, a `__notes__` that raises): before, the drain ended without settling its batch."""

import pytest

import jobs
from jobs import handler
from jobs.core import transitions
from jobs.models import Attempt, Job
from jobs.worker import runner

pytestmark = pytest.mark.django_db(transaction=True)


class _Unprintable(AssertionError):
    def __str__(self) -> str:
        raise RuntimeError("str() of this error raises")


@handler("test.unprintable_assertion")
def _raise_unprintable(ctx):  # type: ignore[no-untyped-def]
    raise _Unprintable()


def test_an_error_whose_str_raises_fails_its_own_job_only():
    bad = jobs.enqueue("test.unprintable_assertion", max_attempts=1, priority=5)
    good = [jobs.enqueue("test.echo", {"n": n}) for n in range(2)]
    runner.drain(budget_seconds=20)
    bad.refresh_from_db()
    assert bad.state == "failed" and "_Unprintable" in bad.error
    assert set(Job.objects.filter(pk__in=[j.pk for j in good]).values_list("state", flat=True)) == {
        "succeeded"
    }


class _FieldsError(Exception):
    """An API error whose fields live in a dict: a name it lacks (`__notes__`, which formatting
    its traceback reads) is a KeyError, not an AttributeError."""

    def __init__(self, fields: dict) -> None:  # type: ignore[type-arg]
        super().__init__("the API said no")
        self.fields = fields

    def __getattr__(self, name: str) -> object:
        return self.fields[name]


class _UnreadableNotes(Exception):
    @property
    def __notes__(self) -> object:
        raise RuntimeError("its notes cannot be read")


@handler("test.unformattable_error")
def _raise_unformattable(ctx):  # type: ignore[no-untyped-def]
    if ctx.payload["which"] == "fields":
        raise _FieldsError({"status": 402})
    raise _UnreadableNotes("boom")


def _drain_between_batch_mates(monkeypatch, kind, payload, max_attempts):  # type: ignore[no-untyped-def]
    """Drain a `kind` job claimed in one batch between two echo jobs (asserted) with a drain
    that must not raise; return the three."""
    batches: list[set[int]] = []
    real = transitions.claim

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        claimed = real(*args, **kwargs)
        batches.append({c.fence.job_id for c in claimed})
        return claimed

    monkeypatch.setattr(runner.transitions, "claim", spy)
    monkeypatch.setattr(
        runner.policy, "next_claim_batch", lambda current, per_job, cap, claim_seconds=0.0: cap
    )
    jobs.enqueue("test.echo", priority=100)  # a batch of one, then batches of CLAIM_BATCH
    first = jobs.enqueue("test.echo", {"n": 1}, priority=6)
    bad = jobs.enqueue(kind, payload, max_attempts=max_attempts, priority=5)
    last = jobs.enqueue("test.echo", {"n": 2}, priority=4)
    raised = None
    try:
        runner.drain(budget_seconds=20)
    except Exception as exc:  # noqa: BLE001  named only: pytest itself cannot format this one
        raised = type(exc).__name__
    assert raised is None, f"the drain raised {raised}"
    assert any({first.pk, bad.pk, last.pk} <= batch for batch in batches), batches
    return first, bad, last


@pytest.mark.parametrize(("which", "cls"), [("fields", _FieldsError), ("notes", _UnreadableNotes)])
def test_an_error_whose_traceback_cannot_be_formatted_fails_its_own_job_and_its_batch_runs(
    monkeypatch, which, cls
):
    """Before: formatting it raised in the runner, and again where the drain settles a batch it
    ends, so nothing was settled: the job was left running until its lease ran out, the batch's
    jobs not started stranded with it, and the drain raised."""
    first, bad, last = _drain_between_batch_mates(
        monkeypatch, "test.unformattable_error", {"which": which}, 1
    )
    bad.refresh_from_db()
    assert bad.state == "failed" and f"{__name__}.{cls.__qualname__}" in bad.error
    assert Attempt.objects.get(job=bad).outcome == "failed"  # its own failure, not an expiry
    states = Job.objects.filter(pk__in=[first.pk, last.pk]).values_list("state", flat=True)
    assert set(states) == {"succeeded"}


class _LazyResponse(dict):  # type: ignore[type-arg]
    """A handler's result read through its own code: its items() raise the API's error."""

    def items(self):  # type: ignore[no-untyped-def,override]
        raise _FieldsError({"status": 502})


@handler("test.unreadable_result")
def _return_unreadable(ctx):  # type: ignore[no-untyped-def]
    return _LazyResponse(order=7)


def test_a_result_whose_error_cannot_be_formatted_fails_its_own_job_and_its_batch_runs(
    monkeypatch,
):
    """A result whose reading raises an error that Python cannot format (traceback's
    format_exception_only reads `__notes__`: KeyError). Before, that KeyError left the runner:
    the job was failed with it as a retryable error, the rest of its batch handed back
    unstarted, and the drain raised."""
    first, bad, last = _drain_between_batch_mates(monkeypatch, "test.unreadable_result", {}, 3)
    bad.refresh_from_db()
    assert (bad.state, bad.attempt) == ("failed", 1)  # unusable: not retried
    assert bad.error.startswith("handler returned an unusable result: ")
    assert f"{__name__}._FieldsError: the API said no" in bad.error
    states = Job.objects.filter(pk__in=[first.pk, last.pk]).values_list("state", flat=True)
    assert set(states) == {"succeeded"}
