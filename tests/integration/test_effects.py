"""Effects under idempotency keys: performed once per (job, step), deduplicated on later
attempts, re-performed with the same key when never recorded, and a stale attempt can never
record its completion over a newer one's. Mail through Django's framework, key in Message-ID."""

import re
from email import message_from_string
from email import policy as email_policy

import pytest
from django.core import mail
from django.db import connection

import jobs
from jobs.core.exceptions import InvalidOption, InvalidPayload, PayloadTooLarge
from jobs.effects import keys as effects
from jobs.models import IdempotencyKey, Job, JobEvent, RejectedWrite
from tests.integration.attempts import claim, expire_and_reap

# transaction=True: the context's ledger writes run outside any transaction of the caller's.
pytestmark = pytest.mark.django_db(transaction=True)

A, B = "host-a:1", "host-b:2"


def test_a_later_attempt_gets_the_recorded_result_without_performing_again():
    job = jobs.enqueue("test.echo")
    calls = []
    first = claim(A)
    assert first.ctx.effect("charge", lambda key: calls.append(key) or {"charged": 7}) == {
        "charged": 7
    }
    first.fail("crashed after the effect")  # retried later

    Job.objects.filter(pk=job.pk).update(run_at="2000-01-01T00:00:00Z")  # the retry is due now
    second = claim(B)
    assert second.ctx.attempt == 2
    assert second.ctx.effect("charge", lambda key: calls.append(key)) == {"charged": 7}

    assert calls == [f"{job.pk}:charge"]  # the key is the job and step, never the attempt
    row = IdempotencyKey.objects.get(key=f"{job.pk}:charge")
    assert (row.status, row.attempt, row.performs, row.repeats) == ("done", 1, 1, 1)
    assert JobEvent.objects.filter(job=job, type="effect_deduplicated", attempt=2).count() == 1


class _ReadsDifferently(dict):
    """A result whose second reading differs from its first (json's encoder reads a dict
    subclass through items())."""

    readings = 0

    def items(self):  # type: ignore[override]
        _ReadsDifferently.readings += 1
        return [("size", "small" if _ReadsDifferently.readings == 1 else "x" * 300_000)]


def test_an_effects_result_is_stored_and_returned_as_its_check_read_it():
    # Before, the result was checked, then encoded again by the ledger's write: the second
    # reading (300 KB, past the payload bound) was stored.
    job = jobs.enqueue("test.echo")
    first = claim(A)
    returned = first.ctx.effect("charge", lambda key: _ReadsDifferently())
    assert returned == {"size": "small"} and type(returned) is dict
    assert IdempotencyKey.objects.get(key=f"{job.pk}:charge").result == {"size": "small"}


def test_an_effect_started_but_never_recorded_is_performed_again_with_the_same_key():
    job = jobs.enqueue("test.echo")
    first = claim(A)
    began = effects.begin(first.held.fence, "notify")  # attempt 1 called fn, then stalled
    expire_and_reap(job.pk)
    second = claim(B)
    keys = []
    assert second.ctx.effect("notify", lambda key: keys.append(key) or "sent") == "sent"
    assert keys == [began.key]
    row = IdempotencyKey.objects.get(key=began.key)
    assert (row.status, row.attempt, row.performs) == ("done", 2, 2)

    # The stale attempt wakes up and tries to record its completion: refused and recorded.
    with pytest.raises(jobs.LeaseLost):
        effects.finish(first.held.fence, began.key, "stale")
    row.refresh_from_db()
    assert (row.attempt, row.result) == (2, "sent")
    rejected = RejectedWrite.objects.get(job=job)
    assert (rejected.write, rejected.attempt_presented, rejected.attempt_current) == (
        "effect",
        1,
        2,
    )
    assert rejected.resource == f"effect {began.key}"


@pytest.mark.parametrize("claimed_again", [True, False], ids=["claimed-again", "reaped-only"])
def test_a_zombie_cannot_start_an_effect_the_job_has_moved_past(claimed_again):
    # Reaped only, the job is queued at the zombie's own attempt number: its state refuses.
    job = jobs.enqueue("test.echo")
    first = claim(A)
    expire_and_reap(job.pk)
    if claimed_again:
        claim(B)
    called = []
    with pytest.raises(jobs.LeaseLost):
        first.ctx.effect("notify", lambda key: called.append(key))
    assert called == []
    assert not IdempotencyKey.objects.filter(job=job).exists()
    assert RejectedWrite.objects.get(job=job).write == "effect"


def test_a_hostile_step_is_refused_before_anything_is_written():
    jobs.enqueue("test.echo")
    running = claim(A)
    for step in ["", "a/b", "x\x00y", "é", "a" * 101, None]:
        with pytest.raises(ValueError):
            running.ctx.effect(step, lambda key: None)
    assert not IdempotencyKey.objects.exists()


def test_an_effect_result_that_cannot_be_stored_leaves_the_effect_unrecorded():
    jobs.enqueue("test.echo")
    running = claim(A)
    with pytest.raises(ValueError):
        running.ctx.effect("bad", lambda key: {"text": "nul\x00"})
    assert IdempotencyKey.objects.get().status == "started"


@pytest.mark.parametrize(
    ("result", "refused"),
    [
        ("x" * 63, PayloadTooLarge),  # 65 bytes of JSON with its quotes
        ({"at": {1, 2}}, InvalidPayload),
        (float("nan"), InvalidPayload),
        (object(), InvalidPayload),
    ],
    ids=["oversize", "set", "nan", "object"],
)
def test_an_effect_result_over_the_payload_bound_or_not_json_is_not_recorded(
    settings, result, refused
):
    settings.JOBS = {**settings.JOBS, "MAX_PAYLOAD_BYTES": 64}
    job = jobs.enqueue("test.echo")
    running = claim(A)
    calls: list[str] = []
    with pytest.raises(refused):
        running.ctx.effect("charge", lambda key: calls.append(key) or result)
    assert calls == [f"{job.pk}:charge"]
    row = IdempotencyKey.objects.get(key=f"{job.pk}:charge")
    assert (row.status, row.result) == ("started", None)  # nothing recorded as performed
    assert not JobEvent.objects.filter(job=job, type="effect_performed").exists()

    assert running.ctx.effect("bounded", lambda key: "x" * 62) == "x" * 62  # 64 bytes: stored
    assert IdempotencyKey.objects.get(key=f"{job.pk}:bounded").status == "done"


def test_an_effect_whose_result_cannot_be_stored_runs_again_on_the_next_attempt():
    job = jobs.enqueue("test.echo")
    first = claim(A)
    calls: list[str] = []

    def unstorable(key: str) -> dict[str, str]:
        calls.append(key)
        return {"text": "nul\x00"}  # performed, but PostgreSQL cannot store the result

    with pytest.raises(ValueError):
        first.ctx.effect("charge", unstorable)
    expire_and_reap(job.pk)
    Job.objects.filter(pk=job.pk).update(run_at="2000-01-01T00:00:00Z")
    second = claim(B)
    assert second.ctx.effect("charge", lambda key: calls.append(key) or {"ok": 1}) == {"ok": 1}
    assert calls == [f"{job.pk}:charge"] * 2  # called again, with the same key
    assert IdempotencyKey.objects.get().performs == 2


def test_mail_is_sent_once_with_the_key_in_its_message_id():
    job = jobs.enqueue("test.echo")
    first = claim(A)
    sent = effects.send_mail(first.ctx, "notice", "Rendered", "Your file is ready", ["a@b.c"])
    expire_and_reap(job.pk)
    Job.objects.filter(pk=job.pk).update(run_at="2000-01-01T00:00:00Z")
    second = claim(B)
    again = effects.send_mail(second.ctx, "notice", "Rendered", "Your file is ready", ["a@b.c"])

    assert again == sent
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    domain = re.escape(effects.mail_domain())
    assert re.fullmatch(rf"<{job.pk}\.notice\.\d+@{domain}>", message.extra_headers["Message-ID"])
    assert message.extra_headers["X-Idempotency-Key"] == f"{job.pk}:notice"
    assert IdempotencyKey.objects.get(key=f"{job.pk}:notice").repeats == 1


@pytest.mark.parametrize("step", ["notice..2", "notice.", "a.-.b..c"])
def test_a_mail_step_that_would_make_an_invalid_message_id_is_refused_before_its_ledger_row(step):
    """The Message-ID's left part, `<job_id>.<step>.<stamp>`, is a dot-atom (RFC 5322): a step
    with '..' or a final '.' made one with an empty part (`<7.notice..1765@...>`), which a server
    requiring a valid Message-ID (Gmail) refuses or rewrites. Before, it was sent as it was."""
    jobs.enqueue("test.echo")
    running = claim(A)
    with pytest.raises(InvalidOption, match="Message-ID"):
        effects.send_mail(running.ctx, step, "Rendered", "Your file is ready", ["a@b.c"])
    assert not mail.outbox and not IdempotencyKey.objects.exists()


@pytest.mark.parametrize("step", ["notice", "a.b-c_d", "x_", "9.-"])
def test_every_mail_step_accepted_makes_a_valid_message_id(step):
    job = jobs.enqueue("test.echo")
    running = claim(A)
    effects.send_mail(running.ctx, step, "Rendered", "Your file is ready", ["a@b.c"])
    raw = mail.outbox[0].message().as_string()
    header = message_from_string(raw, policy=email_policy.default)["Message-ID"]
    # A header longer than a line is folded before the id (" <...>": CFWS, RFC 5322 3.6.4):
    # with a six-digit job id, as late in a full run.
    assert header.strip().startswith(f"<{job.pk}.{step}.") and not header.defects


def test_a_job_id_reused_after_a_restore_gets_a_new_message_id():
    job = jobs.enqueue("test.echo")
    first = claim(A)
    effects.send_mail(first.ctx, "notice", "Rendered", "Your file is ready", ["a@b.c"])
    # A restore from a backup taken before that job: its key row and the job are gone, and the
    # sequence hands the same id out again.
    IdempotencyKey.objects.filter(key=f"{job.pk}:notice").delete()
    Job.objects.filter(pk=job.pk).delete()
    with connection.cursor() as cur:
        cur.execute("SELECT setval(pg_get_serial_sequence('jobs_job', 'id'), %s, false)", [job.pk])
    assert jobs.enqueue("test.echo").pk == job.pk
    second = claim(B)
    effects.send_mail(second.ctx, "notice", "Rendered", "Another file is ready", ["a@b.c"])

    earlier, later = (m.extra_headers["Message-ID"] for m in mail.outbox)
    domain = re.escape(effects.mail_domain())
    for message_id in (earlier, later):
        assert re.fullmatch(rf"<{job.pk}\.notice\.\d+@{domain}>", message_id)
    assert later != earlier


def test_a_stale_attempt_cannot_record_completion_while_the_newer_one_is_performing():
    job = jobs.enqueue("test.echo")
    first = claim(A)
    began = effects.begin(first.held.fence, "notify")
    expire_and_reap(job.pk)
    second = claim(B)
    effects.begin(second.held.fence, "notify")  # attempt 2 took the effect over, calling fn now

    with pytest.raises(jobs.LeaseLost):
        effects.finish(first.held.fence, began.key, "stale")  # attempt 1 wakes up first
    row = IdempotencyKey.objects.get(key=began.key)
    assert (row.status, row.attempt, row.result) == ("started", 2, None)

    effects.finish(second.held.fence, began.key, "fresh")
    row.refresh_from_db()
    assert (row.status, row.attempt, row.result) == ("done", 2, "fresh")


def test_a_job_id_handed_out_again_presents_the_same_effect_key_as_the_lost_job():
    # The key is the job id and the step, nothing of this install or of when the job was made
    # (unlike a mail's Message-ID): a database restored from before a job, or another install
    # sharing the receiver, hands the receiver a key it has seen -- and a deduplicating receiver
    # answers with the other job's effect. README and docs/effects.md say so.
    lost = jobs.enqueue("test.echo")
    keys: list[str] = []
    claim(A).ctx.effect("charge", lambda key: keys.append(key) or {"charged": 7})
    Job.objects.filter(pk=lost.pk).delete()  # the restore: the job and its ledger are gone
    with connection.cursor() as cur:
        cur.execute("SELECT setval(pg_get_serial_sequence('jobs_job', 'id'), %s, false)", [lost.pk])
    again = jobs.enqueue("test.echo")
    assert again.pk == lost.pk
    claim(B).ctx.effect("charge", lambda key: keys.append(key) or {"charged": 9})
    assert keys == [f"{lost.pk}:charge"] * 2
