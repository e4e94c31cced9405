"""The README's ranges, at their edges: each documented limit is accepted and stored as given,
and one step past it is refused with its `ValueError` subclass and writes nothing.

README, "Bad input": `lease_seconds` 0.5 s - 7 days, `max_attempts`
1-1000, `priority` a smallint, `run_at` aware and between 2000 and ten years ahead, `unique_key`
<= 200 characters, payloads nested no deeper than 64 and no larger than `MAX_PAYLOAD_BYTES` of
UTF-8. tests/integration/test_bounds.py refuses values far outside; these pin the edges.
"""

import datetime as dt
import json

import pytest
from django.utils import timezone

import jobs
from jobs.models import Job

pytestmark = pytest.mark.django_db

WEEK = 7 * 24 * 3600.0


def _nested(levels: int) -> list:
    """A JSON array `levels` arrays deep: [[...[1]...]]."""
    value: list = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("option", "edge", "past"),
    [
        ("lease_seconds", 0.5, 0.49),
        ("lease_seconds", WEEK, WEEK + 1),
        ("max_attempts", 1, 0),
        ("max_attempts", 1000, 1001),
        ("priority", 32767, 32768),
        ("priority", -32768, -32769),
        ("unique_key", "k" * 200, "k" * 201),
    ],
)
def test_an_option_at_its_documented_edge_is_stored_and_one_step_past_is_refused(
    option, edge, past
):
    job = jobs.enqueue("test.echo", **{option: edge})
    assert getattr(Job.objects.get(pk=job.pk), option) == edge
    with pytest.raises(jobs.InvalidOption):
        jobs.enqueue("test.echo", **{option: past})
    assert Job.objects.count() == 1


def test_run_at_is_accepted_from_2000_to_ten_years_ahead_and_refused_outside_or_naive():
    earliest = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    nine_years = timezone.now() + dt.timedelta(days=9 * 365)
    for run_at in (earliest, nine_years):
        job = jobs.enqueue("test.echo", run_at=run_at)
        assert Job.objects.get(pk=job.pk).run_at == run_at
    for run_at in (
        earliest - dt.timedelta(microseconds=1),
        timezone.now() + dt.timedelta(days=11 * 365),
        dt.datetime(2030, 1, 1),  # naive: no time zone
    ):
        with pytest.raises(jobs.InvalidOption):
            jobs.enqueue("test.echo", run_at=run_at)
    assert Job.objects.count() == 2


def test_a_payload_nested_64_deep_is_stored_and_65_is_an_invalid_payload():
    job = jobs.enqueue("test.echo", _nested(64))
    assert Job.objects.get(pk=job.pk).payload == _nested(64)
    with pytest.raises(jobs.InvalidPayload):
        jobs.enqueue("test.echo", _nested(65))
    with pytest.raises(jobs.InvalidPayload):
        jobs.enqueue("test.echo", {"a": _nested(64)})  # the object is a level too
    assert Job.objects.count() == 1


def test_a_payload_of_exactly_max_payload_bytes_of_utf8_is_stored_and_one_more_is_too_large(
    settings,
):
    settings.JOBS = {"MAX_PAYLOAD_BYTES": 64}
    # ["é..."]: 4 bytes of brackets and quotes, then 2 bytes per é (UTF-8, not characters).
    fits = ["é" * 30]
    assert len(json.dumps(fits, ensure_ascii=False).encode()) == 64
    job = jobs.enqueue("test.echo", fits)
    assert Job.objects.get(pk=job.pk).payload == fits
    with pytest.raises(jobs.PayloadTooLarge):
        jobs.enqueue("test.echo", ["é" * 30 + "x"])
    with pytest.raises(jobs.PayloadTooLarge):
        jobs.enqueue("test.echo", ["é" * 31])  # 31 characters fewer than 64, 66 bytes
    assert Job.objects.count() == 1
