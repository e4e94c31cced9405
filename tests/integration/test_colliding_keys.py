"""A dict two of whose keys are one key once written as JSON ({1: "a", "1": "b"}: json writes
`{"1":"a","1":"b"}`, and PostgreSQL's jsonb keeps the last) is refused at enqueue with
jobs.InvalidPayload, nested too, and nothing is written. Before, the job was stored with one of
the two values silently gone. Keys of other types that collide with none are stored as before
(as json writes them: 1 -> "1")."""

import enum
import re
from collections import OrderedDict

import pytest
from django.db import transaction

import jobs
from jobs.models import Job, JobEvent
from jobs.worker import runner
from tests.app import tasks

pytestmark = pytest.mark.django_db


class _Code(enum.IntEnum):
    ONE = 1


COLLIDING = [
    ({1: "a", "1": "b"}, "1"),
    ({True: "a", "true": "b"}, "true"),
    ({None: "a", "null": "b"}, "null"),
    ({1.5: "a", "1.5": "b"}, "1.5"),
    ({1e16: "a", "1e+16": "b"}, "1e+16"),
    ({_Code.ONE: "a", "1": "b"}, "1"),  # an IntEnum is written as its number
    ({"outer": {"x": [{2: "a", "2": "b"}]}}, "2"),  # nested in a list in a dict
    ([{"ok": 1}, {0: "a", "0": "b"}], "0"),
    (OrderedDict([(3, "a"), ("3", "b")]), "3"),  # a dict subclass: read as the encoder reads it
    ({"inner": OrderedDict([(False, "a"), ("false", "b")])}, "false"),
]


@pytest.mark.parametrize(("payload", "key"), COLLIDING, ids=[k for _, k in COLLIDING])
def test_a_payload_whose_keys_collide_as_json_is_an_invalid_payload_and_writes_nothing(
    payload, key
):
    with transaction.atomic():
        with pytest.raises(
            jobs.InvalidPayload, match=re.escape(f"same key once stored as JSON ('{key}')")
        ):
            jobs.enqueue("test.echo", payload)
        assert not Job.objects.exists() and not JobEvent.objects.exists()
        jobs.enqueue("test.echo", {"n": 1})  # the caller's transaction goes on
    assert Job.objects.count() == 1


def test_the_manager_refuses_it_too():
    with pytest.raises(jobs.InvalidPayload, match="same key once stored as JSON"):
        Job.objects.enqueue("test.echo", {"a": {1: "x", "1": "y"}})
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("payload", "stored"),
    [
        ({1: "a", 2: "b"}, {"1": "a", "2": "b"}),
        (
            {1: "a", "2": "b", None: "c", False: "d", 1.5: "e"},
            {"1": "a", "2": "b", "null": "c", "false": "d", "1.5": "e"},
        ),
        ({"a": {3: [1, {4: 5}]}}, {"a": {"3": [1, {"4": 5}]}}),
    ],
)
def test_non_string_keys_that_collide_with_none_are_stored_as_before(payload, stored):
    job = jobs.enqueue("test.echo", payload)
    assert Job.objects.get(pk=job.pk).payload == stored


@pytest.mark.django_db(transaction=True)
def test_a_tasks_arguments_whose_keys_collide_are_refused_as_a_payload():
    # django.tasks: the arguments are the job's payload, checked by the same enqueue.
    with pytest.raises(jobs.InvalidPayload, match="same key once stored as JSON"):
        tasks.add.enqueue({1: "a", "1": "b"}, 1)
    with pytest.raises(jobs.InvalidPayload, match="same key once stored as JSON"):
        tasks.add.enqueue(1, b=[{"k": {0: 1, "0": 2}}])
    # bytes keys are decoded by Django's normalize_json: b"k" and "k" were one key silently
    with pytest.raises(jobs.InvalidPayload, match="same key once stored as JSON"):
        tasks.add.enqueue({b"k": 1, "k": 2}, 1)
    assert not Job.objects.exists()
    result = tasks.add.enqueue({1: "a", 2: "b"}, 1)
    assert Job.objects.get(pk=int(result.id)).payload["args"][0] == {"1": "a", "2": "b"}


@pytest.mark.django_db(transaction=True)
def test_a_handlers_result_or_progress_whose_keys_collide_is_refused(swap_handler):
    # The same rule for every JSON value stored: progress is the handler's error at once, a
    # result the job's failure, not retried (as any result that cannot be stored).
    refused = []

    def colliding(ctx):
        try:
            ctx.checkpoint({"done": {1: "a", "1": "b"}})
        except jobs.InvalidPayload as exc:
            refused.append(str(exc))
        return {None: "a", "null": "b"}

    swap_handler("test.echo", colliding)
    job = jobs.enqueue("test.echo")
    runner.drain()
    job.refresh_from_db()
    assert refused and "progress has the keys 1 and '1'" in refused[0]
    assert (job.state, job.attempt, job.progress) == ("failed", 1, None)
    assert "unusable result: result has the keys None and 'null'" in job.error
