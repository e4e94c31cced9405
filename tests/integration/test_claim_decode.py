"""What a claim hands over and what a commit sends, built without a step per row in Python:
the claimed jobs decoded in one pass (one bad payload still fails alone), the claim's rows made
by psycopg's row factory, the commit's integers sent as array literals."""

import pytest
from django.db import connection

import jobs
from jobs.core import transitions
from jobs.core.sql import ClaimedRow, CommitRow, driver_for
from jobs.core.sql.rows import JSONText, commit_arrays, loads_many
from jobs.core.states import JobState
from jobs.core.transitions import Claimed, Fence
from jobs.models import Job
from tests.integration.attempts import insert_undecodable_job

WORKER = "host-a:101"


@pytest.mark.django_db(transaction=True)
def test_a_batch_with_one_undecodable_payload_claims_the_others_and_fails_that_one():
    first = jobs.enqueue("test.echo", {"n": 1}, priority=9)
    bad_id = insert_undecodable_job()  # valid jsonb, beyond Python's recursion limit
    last = jobs.enqueue("test.echo", {}, priority=1)
    claimed = transitions.claim(WORKER, limit=3, lease_seconds=30)
    assert [(c.fence, c.payload) for c in claimed] == [
        (Fence(first.pk, 1, WORKER), {"n": 1}),
        (Fence(last.pk, 1, WORKER), {}),
    ]
    bad = Job.objects.values("state", "error").get(pk=bad_id)
    assert bad["state"] == JobState.FAILED and "payload could not be decoded" in bad["error"]


@pytest.mark.django_db(transaction=True)
def test_a_claimed_job_carries_every_field_of_its_row():
    job = jobs.enqueue("test.echo", {"n": 1}, max_attempts=4, lease_seconds=12)
    (claimed,) = transitions.claim(WORKER, limit=5, lease_seconds=30)
    assert type(claimed) is Claimed
    assert claimed == Claimed(Fence(job.pk, 1, WORKER), "test.echo", {"n": 1}, 4, 12.0, 0)


@pytest.mark.django_db(transaction=True)
def test_empty_payloads_are_distinct_dicts():
    for _ in range(2):
        jobs.enqueue("test.echo", {})
    a, b = transitions.claim(WORKER, limit=2, lease_seconds=30)
    a.payload["mutated"] = True
    assert b.payload == {}


@pytest.mark.django_db(transaction=True)
def test_the_drivers_claim_returns_claimed_rows_and_leaves_the_cursors_row_factory_alone():
    job = jobs.enqueue("test.echo", {"n": 1})
    with connection.cursor() as cur:
        rows = driver_for(connection.vendor).claim(cur, WORKER, 5, 30.0, None, {})
        cur.execute("SELECT 1, 2")
        after = cur.fetchone()
    assert [type(r) for r in rows] == [ClaimedRow]
    assert (rows[0].id, rows[0].attempt, rows[0].kind) == (job.pk, 1, "test.echo")
    assert type(after) is tuple and after == (1, 2)


def test_the_commit_sends_its_integers_as_array_literals_and_encodes_each_result_once():
    text = JSONText('{"a":1}')
    rows = [CommitRow(7, 2, text, "jobs/7/attempt-2/"), CommitRow(8, 1, {"b": [1]}, "")]
    arrays = commit_arrays(rows)
    assert arrays == {
        "ids": "{7,8}",
        "attempts": "{2,1}",
        "results": ['{"a":1}', '{"b":[1]}'],
        "refs": ["jobs/7/attempt-2/", ""],
    }
    assert arrays["results"][0] is text  # sent as it is, never encoded again
    assert commit_arrays([]) == {"ids": "{}", "attempts": "{}", "results": [], "refs": []}


def test_a_commit_array_literal_only_ever_holds_integers():
    with pytest.raises(ValueError):
        commit_arrays([CommitRow("1},{2", 1, None, "")])  # type: ignore[arg-type]


def test_payloads_decode_together_as_each_would_alone():
    texts = ['{"n":1}', "{}", "[1,2]", '"x"', "null"]
    decoded = loads_many(texts)
    assert decoded == [{"n": 1}, {}, [1, 2], "x", None]
    assert loads_many(["{}", "{}"])[0] is not loads_many(["{}", "{}"])[1]


def test_texts_that_are_not_one_json_value_each_are_refused_not_misread():
    for texts in (["1,2", "3"], ["[1", "2]"], ["", "{}"], ["{}", " "]):
        with pytest.raises(ValueError):
            loads_many(texts)


def test_values_already_decoded_pass_through():
    assert loads_many([{"a": 1}, '{"b":2}']) == [{"a": 1}, {"b": 2}]
