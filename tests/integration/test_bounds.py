"""No input stops a queue: hostile values are refused where they enter, and a row that still
makes a statement fail is failed alone while the queue keeps moving."""

import collections
import datetime as dt
import json
import math
import sys

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.utils import timezone

import jobs
from jobs.core import bounds, transitions
from jobs.core.registry import handler
from jobs.core.states import JobState
from jobs.models import Job, JobEvent
from jobs.worker import runner
from tests.integration.attempts import insert_undecodable_job

pytestmark = pytest.mark.django_db

WORKER = "host-a:1"


def _nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "options", "error"),
    [
        ({}, {"lease_seconds": 1e13}, jobs.InvalidOption),  # overflowed the claim's interval
        ({}, {"lease_seconds": math.inf}, jobs.InvalidOption),
        ({}, {"lease_seconds": 0.01}, jobs.InvalidOption),
        ({}, {"max_attempts": 10**6}, jobs.InvalidOption),
        ({}, {"max_attempts": 10**400}, jobs.InvalidOption),
        ({}, {"priority": 10**400}, jobs.InvalidOption),
        ({}, {"run_at": timezone.now() + dt.timedelta(days=365 * 50)}, jobs.InvalidOption),
        ({}, {"run_at": dt.datetime(1900, 1, 1, tzinfo=dt.UTC)}, jobs.InvalidOption),
        ({}, {"unique_key": "a\x00b"}, jobs.InvalidOption),
        ({}, {"unique_key": "lone \ud800"}, jobs.InvalidOption),
        ({}, {"unique_key": "k" * 201}, jobs.InvalidOption),  # else the column's DataError
        ({"text": "a\x00b"}, {}, jobs.InvalidPayload),
        ({"text": "lone \ud800 surrogate"}, {}, jobs.InvalidPayload),
        ({"nul\x00key": 1}, {}, jobs.InvalidPayload),
        ({"deep": _nested(70)}, {}, jobs.InvalidPayload),
    ],
)
def test_hostile_enqueue_input_is_a_clear_value_error_and_writes_nothing(payload, options, error):
    with pytest.raises(error) as excinfo:
        jobs.enqueue("test.echo", payload, **options)
    assert isinstance(excinfo.value, ValueError)
    assert not Job.objects.exists() and not JobEvent.objects.exists()


class _UnreadableDict(dict):
    def items(self):
        raise KeyError("its own code raised")


def test_a_payload_whose_own_code_raises_raises_that_error_and_writes_nothing():
    # Not a ValueError: the payload's own error, as its code raised it (bounds._checked_json).
    with transaction.atomic():
        with pytest.raises(KeyError, match="its own code raised"):
            jobs.enqueue("test.echo", {"nested": _UnreadableDict(a=1)})
        assert not Job.objects.exists() and not JobEvent.objects.exists()
        jobs.enqueue("test.echo")  # the caller's transaction goes on
    assert Job.objects.count() == 1


def test_a_literal_backslash_u0000_text_is_not_mistaken_for_nul():
    job = jobs.enqueue("test.echo", {"text": "\\u0000 is six characters"})
    assert Job.objects.get(pk=job.pk).payload == {"text": "\\u0000 is six characters"}


def test_a_unique_key_of_200_characters_is_stored_as_given():
    key = "😀" + "k" * 199  # characters, not bytes: 203 bytes of UTF-8
    job = jobs.enqueue("test.echo", unique_key=key)
    assert Job.objects.get(pk=job.pk).unique_key == key


def test_a_payload_with_astral_characters_is_stored():
    job = jobs.enqueue("test.echo", {"text": "😀 \u00e9"})
    assert Job.objects.get(pk=job.pk).payload == {"text": "😀 \u00e9"}


@pytest.mark.parametrize(
    "number", [1e308, -1e308, 5e-324, 1.7976931348623157e308, 1.5e-07, 1e16, -1.25e-05, 2.5]
)
def test_a_number_is_sized_as_the_database_writes_it_back(number):
    # jsonb keeps a number as numeric and writes it in plain notation: 1e+308 is 309 bytes.
    with connection.cursor() as cur:
        cur.execute("SELECT octet_length((%s)::jsonb::text)", [json.dumps(number)])
        (stored,) = cur.fetchone()
    assert bounds.json_value(number, 10_000) == bounds.json_value([number], 10_000) - 2 == stored


@pytest.fixture
def no_int_digit_limit():
    """Python as PYTHONINTMAXSTRDIGITS=0 runs it: ints of any length written and read."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    yield
    sys.set_int_max_str_digits(before)


def test_an_integer_longer_than_numeric_holds_is_an_invalid_payload_and_the_transaction_goes_on(
    no_int_digit_limit, settings
):
    # PostgreSQL's numeric holds 131,072 digits before the point; one more failed the INSERT
    # with a DataError that aborted the caller's transaction.
    settings.JOBS = {"MAX_PAYLOAD_BYTES": 1024 * 1024}
    longest, too_long = 10**131_071, 10**131_072
    with transaction.atomic():
        with pytest.raises(jobs.InvalidPayload, match="more than 131072 digits"):
            jobs.enqueue("test.echo", {"n": [1, -too_long]})
        with pytest.raises(jobs.InvalidPayload):
            jobs.enqueue("test.echo", too_long)
        job = jobs.enqueue("test.echo", {"n": -longest, "text": "9" * 140_000})
    assert Job.objects.get(pk=job.pk).payload == {"n": -longest, "text": "9" * 140_000}
    assert Job.objects.count() == 1


def test_at_pythons_default_digit_limit_an_integer_past_it_is_an_invalid_payload(settings):
    # What the README's "longer than Python writes, 4,300 digits" means, at Python's default.
    assert sys.get_int_max_str_digits() == 4300
    settings.JOBS = {"MAX_PAYLOAD_BYTES": 1024 * 1024}
    with transaction.atomic():
        with pytest.raises(jobs.InvalidPayload, match="4300 digits"):
            jobs.enqueue("test.echo", {"n": 10**4300})
        job = jobs.enqueue("test.echo", {"n": 10**4299})
    assert Job.objects.get(pk=job.pk).payload == {"n": 10**4299}


def test_a_payload_of_numbers_the_database_writes_back_longer_is_too_large(settings):
    settings.JOBS = {"MAX_PAYLOAD_BYTES": 4096}
    payload = {"values": [1e308] * 100}  # 711 bytes as encoded, ~31 KB as PostgreSQL gives it back
    assert len(json.dumps(payload, separators=(",", ":"))) < 4096
    with pytest.raises(jobs.PayloadTooLarge):
        jobs.enqueue("test.echo", payload)
    assert not Job.objects.exists()
    # Text that merely looks like such a number is a string, stored as it is: not counted so.
    job = jobs.enqueue("test.echo", {"text": "1e+308 " * 400})
    assert Job.objects.get(pk=job.pk).payload == {"text": "1e+308 " * 400}
    jobs.enqueue("test.echo", {"values": [1e308] * 10, "quoted": '"1e+308\\"'})


@pytest.mark.parametrize(
    "options", [{"lease_seconds": 1e13}, {"max_attempts": 0}, {"max_attempts": 10**6}]
)
def test_handler_registration_refuses_out_of_range_options(options):
    with pytest.raises(jobs.InvalidOption):
        handler("test.never_registered", **options)


@pytest.mark.parametrize(
    "jobs_setting",
    [
        {"RETRY_MAX_SECONDS": 1e13},
        {"RETRY_BASE_SECONDS": -1},
        {"LEASE_SECONDS": 1e13, "HEARTBEAT_SECONDS": 1},
        {"MAX_ATTEMPTS": 0},
    ],
)
def test_out_of_range_settings_are_refused(jobs_setting):
    from jobs.core.conf import jobs_settings

    with override_settings(JOBS=jobs_setting), pytest.raises(ValueError, match="outside"):
        jobs_settings()


@pytest.mark.parametrize(
    "column, value", [("lease_seconds", 1e13), ("lease_seconds", "NaN"), ("max_attempts", 10**6)]
)
def test_the_database_refuses_a_raw_row_with_an_overflowing_option(column, value):
    """Rows inserted without enqueue meet the same bounds, as CHECK constraints."""
    with pytest.raises(IntegrityError), connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO jobs_job (kind, {column}) VALUES ('test.echo', %s)",  # noqa: S608
            [value],
        )


def test_the_claim_sets_the_handlers_lease_from_the_first_lease():
    jobs.enqueue("test.long_lease")  # @handler(lease_seconds=600)
    (claimed,) = transitions.claim(WORKER, lease_seconds=30)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT extract(epoch FROM lease_expires_at - clock_timestamp()) FROM jobs_job "
            "WHERE id = %s",
            [claimed.fence.job_id],
        )
        remaining = cur.fetchone()[0]
    assert 590 < remaining <= 600


@pytest.mark.django_db(transaction=True)
def test_progress_that_is_not_storable_json_is_a_clear_error(swap_handler):
    errors = []

    def checkpoint_hostile(ctx):
        for progress in ({"x": math.nan}, {"t": "a\x00b"}, {"big": "x" * 300_000}):
            try:
                ctx.checkpoint(progress)
            except ValueError as exc:
                errors.append(type(exc).__name__)
        ctx.checkpoint({"ok": True})
        return "done"

    swap_handler("test.echo", checkpoint_hostile)
    job = jobs.enqueue("test.echo")
    runner.drain()
    job.refresh_from_db()
    assert errors == ["InvalidPayload", "InvalidPayload", "PayloadTooLarge"]
    assert (job.state, job.progress, job.result) == (JobState.SUCCEEDED, {"ok": True}, "done")


class _ReadsDifferently(dict):
    """Small the first time its items are read, something else every time after."""

    def __init__(self, later):
        super().__init__()
        self.later, self.readings = later, 0

    def items(self):
        self.readings += 1
        return [("p", 1)] if self.readings == 1 else [("p", self.later)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "later", ["x" * 2_000_000, math.nan, "a\x00b", _nested(500)], ids=["big", "nan", "nul", "deep"]
)
def test_a_checkpoint_stores_the_very_text_it_checked(swap_handler, later):
    """Progress is read once: checked and stored as one JSON text (it was checked, then encoded
    again for the statement: 2 MB stored past the limit, NaN or NUL a raw DataError)."""
    progress = _ReadsDifferently(later)
    swap_handler("test.echo", lambda ctx: ctx.checkpoint(progress) or "done")
    job = jobs.enqueue("test.echo")
    runner.drain()
    job.refresh_from_db()
    assert (job.state, job.progress, job.result) == (JobState.SUCCEEDED, {"p": 1}, "done")
    assert progress.readings == 1


class _HidingValues(dict):
    def values(self):
        return []


def test_a_container_subclass_is_checked_as_the_encoder_reads_it():
    """json's encoder reads a dict subclass through items() and a list or tuple subclass through
    its __iter__: the depth check sees the same children (a values() hiding them let 500 levels
    through), and a well-behaved subclass encodes as json.dumps would."""
    with pytest.raises(jobs.InvalidPayload, match="deeper than 64"):
        bounds.json_text(_HidingValues(a=_nested(500)), 10**6, "result")
    with pytest.raises(jobs.InvalidPayload, match="deeper than 64"):
        bounds.json_text([_HidingValues(a=[_HidingValues(b=_nested(70))])], 10**6, "result")
    point = collections.namedtuple("point", "x y")
    for value in (
        collections.OrderedDict(b=1, a=[point(1, 2)]),
        collections.defaultdict(list, k=(1, 2)),
        collections.Counter("abca"),
        type("Row", (list,), {})([1, {"k": point(3, 4)}]),
    ):
        assert json.loads(bounds.json_text(value, 10**6)) == json.loads(json.dumps(value))


# -- defence in depth: rows that still make a statement fail -------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_raw_row_whose_payload_cannot_be_decoded_fails_and_the_queue_moves_on():
    bad_id = insert_undecodable_job()  # valid jsonb, beyond Python's recursion limit
    good = jobs.enqueue("test.echo", {"n": 1})
    runner.drain()
    bad = Job.objects.values("state", "error").get(pk=bad_id)  # the payload stays undecoded
    assert bad["state"] == JobState.FAILED and "payload could not be decoded" in bad["error"]
    assert Job.objects.get(pk=good.pk).state == JobState.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_row_the_claim_statement_refuses_is_failed_and_the_others_are_claimed():
    poison = jobs.enqueue("test.echo", {"n": 0}, priority=5)
    others = [jobs.enqueue("test.echo", {"n": n}) for n in (1, 2)]
    with connection.cursor() as cur:
        # Whatever the reason, the database refuses to move this one row to running.
        cur.execute(
            "ALTER TABLE jobs_job ADD CONSTRAINT test_refuse_one "
            f"CHECK (id <> {poison.pk} OR state <> 'running') NOT VALID"
        )
    try:
        claimed = transitions.claim(WORKER, limit=3, lease_seconds=30)
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE jobs_job DROP CONSTRAINT test_refuse_one")
    assert {c.fence.job_id for c in claimed} == {j.pk for j in others}
    poison.refresh_from_db()
    assert poison.state == JobState.FAILED and "refused to claim" in poison.error
    assert JobEvent.objects.filter(job=poison, type="poisoned").exists()


@pytest.mark.django_db(transaction=True)
def test_a_row_refused_even_as_a_failure_stays_queued_and_the_others_are_claimed():
    stuck = jobs.enqueue("test.echo", {"n": 0}, priority=5)
    others = [jobs.enqueue("test.echo", {"n": n}) for n in (1, 2)]
    with connection.cursor() as cur:
        cur.execute(
            "ALTER TABLE jobs_job ADD CONSTRAINT test_refuse_one "
            f"CHECK (id <> {stuck.pk} OR state = 'queued') NOT VALID"
        )
    try:
        claimed = transitions.claim(WORKER, limit=3, lease_seconds=30)
    finally:
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE jobs_job DROP CONSTRAINT test_refuse_one")
    assert {c.fence.job_id for c in claimed} == {j.pk for j in others}
    assert Job.objects.get(pk=stuck.pk).state == JobState.QUEUED
