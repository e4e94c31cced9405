"""Mail is at-least-once with a recorded possible duplicate, at a real SMTP server: attempt 1's
message is accepted but its worker never hears the `250`; the reaper reclaims; attempt 2 sends
again under the same key and Message-ID. That second send is recorded (`mail_resent`), counted by
/metrics, shown on the job page and logged. A send started and never recorded is taken over the
same way when nothing reached the server (connection refused): recorded all the same, since the
ledger cannot tell. The Message-ID's domain is per install, never a constant."""

import logging
import socket
import threading

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.mail.backends.base import BaseEmailBackend
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

import jobs
from jobs.context import JobContext
from jobs.core.exceptions import InvalidOption, LeaseLost
from jobs.effects import keys
from jobs.models import IdempotencyKey, Job, JobEvent, RejectedWrite
from jobs.ops import metrics
from tests.integration.attempts import claim, expire_and_reap
from tests.slow_receivers import wait_for
from tests.smtp_receiver import smtp_server

pytestmark = pytest.mark.django_db(transaction=True)


def _use_smtp(settings: object, port: int) -> None:
    settings.MAILERS = {  # type: ignore[attr-defined]
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": port, "timeout": 20},
        }
    }


def _send(ctx: object) -> dict[str, object]:
    return keys.send_mail(ctx, "notice", "Ready", "Your file is ready", ["ops@example.com"])


def test_a_mail_sent_again_after_a_lost_250_is_recorded_counted_shown_and_logged(
    settings, caplog, monkeypatch
):
    monkeypatch.setattr(metrics, "SETTLE_SECONDS", 0.0)  # every event row counts at once
    with smtp_server() as box:
        _use_smtp(settings, box.port)
        box.hold_first_reply = True
        job = jobs.enqueue("test.echo")
        first = claim("host-a:1")
        outcome: list[object] = []

        def stalled_worker() -> None:
            try:
                outcome.append(_send(first.ctx))
            except LeaseLost as exc:
                outcome.append(exc)
            finally:
                connection.close()

        worker = threading.Thread(target=stalled_worker, daemon=True)
        worker.start()
        wait_for(lambda: box.count() == 1, 10, "attempt 1's message never reached the server")

        expire_and_reap(job.pk)  # attempt 1's worker has not heard the 250
        second = claim("host-b:2")
        with caplog.at_level(logging.WARNING, logger="jobs.effects"):
            result = _send(second.ctx)
        box.release.set()
        worker.join(30)

        # The server kept both: mail servers do not deduplicate.
        first_id, second_id = box.message_ids()
        assert first_id == second_id == result["message_id"]
        assert isinstance(outcome[0], LeaseLost)  # attempt 1 cannot record over attempt 2

    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.kind, row.performs, row.attempt, row.status) == ("mail", 2, 2, "done")
    (event,) = JobEvent.objects.filter(job_id=job.pk, type="mail_resent")
    assert event.attempt == 2 and event.data["message_id"] == first_id
    logged = [r.getMessage() for r in caplog.records]
    assert any("sent again" in line and first_id in line for line in logged)

    families = {f.name: f for f in metrics.collect_families()}
    assert families["jobs_mail_resent"].samples[0].value == 1

    staff = User.objects.create_user("mailstaff", password="x", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    page = client.get(reverse("dashboard:job", args=[job.pk])).content.decode()
    assert "duplicate detected" in page


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_mail_whose_first_send_never_reached_the_server_is_still_recorded_as_resent(settings):
    job = jobs.enqueue("test.echo")
    first = claim("host-a:1")
    _use_smtp(settings, _closed_port())
    with pytest.raises(ConnectionRefusedError) as refused:
        _send(first.ctx)  # started, refused before anything was sent, never recorded
    first.fail(repr(refused.value))  # the handler raised: retried
    Job.objects.filter(pk=job.pk).update(run_at=Now())  # its backoff, over
    with smtp_server() as box:
        _use_smtp(settings, box.port)
        result = _send(claim("host-b:2").ctx)
        assert box.message_ids() == [result["message_id"]]  # the server got it once

    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.performs, row.attempt, row.status) == (2, 2, "done")
    (event,) = JobEvent.objects.filter(job_id=job.pk, type="mail_resent")
    assert (event.attempt, event.data["sends"]) == (2, 2)  # a possible duplicate, not a proven one


def test_a_mail_sent_once_records_no_duplicate(settings):
    with smtp_server() as box:
        _use_smtp(settings, box.port)
        job = jobs.enqueue("test.echo")
        _send(claim("host-a:1").ctx)
        assert box.count() == 1
    assert not JobEvent.objects.filter(job_id=job.pk, type="mail_resent").exists()
    assert IdempotencyKey.objects.get().kind == "mail"


def test_the_message_id_domain_is_per_install_never_a_shared_constant(settings):
    settings.JOBS_MAIL_DOMAIN = ""
    settings.SECRET_KEY = "install-one-" + "x" * 40
    one = keys.mail_domain()
    settings.SECRET_KEY = "install-two-" + "x" * 40
    two = keys.mail_domain()
    assert one != two and "palisade.invalid" not in (one, two)
    assert settings.SECRET_KEY not in two

    settings.JOBS_MAIL_DOMAIN = "mail.example.org"
    assert keys.mail_domain() == "mail.example.org"
    settings.JOBS_MAIL_DOMAIN = "bad domain>"
    with pytest.raises(InvalidOption):
        keys.mail_domain()


# -- the ledger is on disk before a mail leaves --------------------------------------------------

_BEGUN_AT: list[str] = []  # the WAL position right after each ledger `begin`
_FLUSHED_AT_SEND: list[bool] = []


class FlushCheckingBackend(BaseEmailBackend):
    """At the moment of sending: is everything the last `begin` wrote flushed to disk?"""

    def send_messages(self, email_messages):  # type: ignore[no-untyped-def]
        with connection.cursor() as cur:
            cur.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [_BEGUN_AT[-1]])
            _FLUSHED_AT_SEND.append(bool(cur.fetchone()[0]))
        return len(email_messages)


def test_the_ledger_row_is_on_disk_before_a_mail_leaves_first_send_and_resend(
    settings, monkeypatch
):
    # The ledger's own transactions commit without a WAL flush (keys.py, Durability); a mail
    # must never leave before its ledger row is durable, or a database crash after the send
    # would lose the record of it: the next attempt would send again unrecorded, under a new
    # Message-ID. The synchronous writes before the send (the row marked "mail"; a resend's
    # `mail_resent` event) flush it.
    settings.MAILERS = {"default": {"BACKEND": f"{__name__}.FlushCheckingBackend"}}
    real_begin = keys.begin

    def begin(fence, step):  # type: ignore[no-untyped-def]
        begun = real_begin(fence, step)
        with connection.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            _BEGUN_AT.append(cur.fetchone()[0])
        return begun

    monkeypatch.setattr(keys, "begin", begin)
    _BEGUN_AT.clear()
    _FLUSHED_AT_SEND.clear()
    job = jobs.enqueue("test.echo")
    first = claim("host-a:1")
    keys.begin(first.claimed.fence, "notice")  # attempt 1 started the mail, never recorded it
    expire_and_reap(job.pk)
    _send(claim("host-b:2").ctx)  # a resend
    other = jobs.enqueue("test.echo")
    Job.objects.filter(pk=other.pk).update(run_at=Now())
    _send(claim("host-a:3").ctx)  # a first send
    assert _FLUSHED_AT_SEND == [True, True]


@pytest.mark.parametrize(
    "subject, to",
    [
        ("Ready\r\nBcc: victim@example.com", ["ops@example.com"]),  # a header injected
        ("Ready", ["ops@example.com\r\nBcc: victim@example.com"]),
        ("Ready", "ops@example.com"),  # a string, not a list of addresses
    ],
)
def test_a_mail_the_framework_refuses_is_refused_before_its_ledger_row_never_a_duplicate(
    settings, subject, to
):
    """Before, the ledger row was begun (a send started) and only then did the mail framework
    refuse the header: every retry of the job recorded a `mail_resent`, a possible duplicate of a
    mail that never left ("duplicate detected" on the job page, counted by /metrics)."""
    with smtp_server() as box:
        _use_smtp(settings, box.port)
        job = jobs.enqueue("test.echo")
        for worker in ("host-a:1", "host-b:2"):
            running = claim(worker)
            with pytest.raises(InvalidOption, match="send_mail"):
                keys.send_mail(running.ctx, "notice", subject, "body", to)
            running.fail("the handler's mail was refused")
            Job.objects.filter(pk=job.pk).update(run_at=Now())  # its backoff, over
        assert box.count() == 0  # nothing left, nothing injected
    assert not IdempotencyKey.objects.exists()  # no send was started
    assert not JobEvent.objects.filter(job_id=job.pk, type="mail_resent").exists()


@pytest.mark.parametrize("to", [[], [""], ("", ""), None], ids=["empty", "blank", "blanks", "none"])
def test_a_mail_to_no_address_is_refused_before_its_ledger_row_never_recorded_as_sent(to):
    """Django's send() returns 0 for a message without a recipient: the effect was recorded as
    done (`{"sent": 0}`), so no later attempt would ever send it. Refused now, before the ledger
    row, and the attempt goes on: its next mail, with an address, is sent."""
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    with pytest.raises(InvalidOption, match="no recipient"):
        keys.send_mail(running.ctx, "notice", "Ready", "body", to)
    assert not IdempotencyKey.objects.exists() and mail.outbox == []

    sent = keys.send_mail(running.ctx, "notice", "Ready", "body", ["", "ops@example.com"])
    assert sent["sent"] == 1 and mail.outbox[0].recipients() == ["ops@example.com"]
    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.status, row.performs) == ("done", 1)


def test_a_mail_to_an_iterator_of_addresses_is_sent_to_them_not_recorded_as_sent_to_none():
    """`to` was read twice: by the check before the ledger row, then by the send. An iterator
    (`map(str.strip, ...)`) reached the send empty: Django's send() returned 0, the effect was
    recorded as done and no attempt ever sent the mail."""
    job = jobs.enqueue("test.echo")
    running = claim("host-a:1")
    sent = keys.send_mail(
        running.ctx, "notice", "Ready", "body", map(str.strip, [" ops@example.com "])
    )
    assert sent["sent"] == 1 and [m.recipients() for m in mail.outbox] == [["ops@example.com"]]
    assert IdempotencyKey.objects.get(key=f"{job.pk}:notice").status == "done"


def test_a_zombie_waking_between_its_begin_and_its_send_is_refused_one_resend_recorded():
    """Attempt 1 began the mail's step and stalled before its mark; its lease ran out, attempt 2
    took the step over (a possible duplicate, recorded once) and sent. Before, the zombie then
    read attempt 2's send count, recorded a second `mail_resent` for that one duplicate and sent
    the mail again. Its mark is fenced now: refused and recorded, nothing sent."""
    job = jobs.enqueue("test.echo")
    zombie = claim("host-a:1")
    replaced: list[dict[str, object]] = []

    def stalled_until_replaced(write):  # type: ignore[no-untyped-def]
        # Here the zombie has begun (its ledger row started under attempt 1), not yet marked.
        expire_and_reap(job.pk)
        replaced.append(_send(claim("host-b:2").ctx))
        JobContext._outside_transaction(zombie.ctx, write)

    zombie.ctx._outside_transaction = stalled_until_replaced  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        _send(zombie.ctx)

    assert [m.extra_headers["Message-ID"] for m in mail.outbox] == [replaced[0]["message_id"]]
    (event,) = JobEvent.objects.filter(job_id=job.pk, type="mail_resent")
    assert (event.attempt, event.data["sends"]) == (2, 2)
    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.status, row.attempt, row.performs) == ("done", 2, 2)
    assert RejectedWrite.objects.filter(job_id=job.pk, attempt_presented=1, write="effect").exists()


def test_a_zombie_waking_between_its_begin_and_its_send_after_a_takeover_sends_nothing():
    """As above, but the replacement has not reached the mail's step yet: the ledger row is
    still the zombie's own begin. The job's attempt decides: refused, recorded, nothing sent."""
    job = jobs.enqueue("test.echo")
    zombie = claim("host-a:1")

    def stalled_until_taken_over(write):  # type: ignore[no-untyped-def]
        expire_and_reap(job.pk)
        claim("host-b:2")  # attempt 2 runs; it has not begun the step
        JobContext._outside_transaction(zombie.ctx, write)

    zombie.ctx._outside_transaction = stalled_until_taken_over  # type: ignore[method-assign]
    with pytest.raises(LeaseLost):
        _send(zombie.ctx)

    assert mail.outbox == []
    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.status, row.attempt, row.performs, row.kind) == ("started", 1, 1, "effect")
    assert RejectedWrite.objects.filter(job_id=job.pk, attempt_presented=1, write="effect").exists()
