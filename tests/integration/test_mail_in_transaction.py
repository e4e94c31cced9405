"""send_mail called inside the handler's own transaction (`transaction.atomic()` around the
handler, or around the part that mails): its ledger writes stay outside that transaction, like
ctx.effect's begin and finish. Before, send_mail's mark of the key row ran on the handler's
connection: it held the row's lock until the handler's transaction ended, so the ledger's finish
(on the context's own connection) waited for it until its deadline cut it -- the mail sent and
nothing recorded, on every attempt -- and a rollback erased the record of a possible duplicate."""

import time

import pytest
from django.core import mail
from django.db import transaction

import jobs
from jobs.context import close_side_connection
from jobs.effects import keys as effects
from jobs.models import IdempotencyKey, Job, JobEvent
from tests.integration.attempts import claim, expire_and_reap

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE = 2.0  # JOBS_DB_TIMEOUT_SECONDS here: what cut the finish before


@pytest.fixture(autouse=True)
def _short_deadline(settings):
    settings.JOBS = {**settings.JOBS, "DB_TIMEOUT_SECONDS": DEADLINE}
    yield
    close_side_connection()  # the ledger wrote on the context's connection of its own


def test_a_mail_sent_inside_the_handlers_transaction_is_recorded_at_once():
    job = jobs.enqueue("test.echo")
    first = claim("host-a:1")
    started = time.monotonic()
    with transaction.atomic():
        sent = effects.send_mail(first.ctx, "notice", "Ready", "Your file", ["a@b.c"])
    assert time.monotonic() - started < DEADLINE  # before: OperationalError at the deadline
    assert sent["sent"] == 1 and len(mail.outbox) == 1
    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.status, row.kind, row.performs) == ("done", "mail", 1)
    assert row.result == sent


def test_a_resend_inside_a_handlers_transaction_that_rolls_back_stays_recorded():
    job = jobs.enqueue("test.echo")
    first = claim("host-a:1")
    effects.begin(first.held.fence, "notice")  # attempt 1 started the send, never recorded it
    expire_and_reap(job.pk)
    Job.objects.filter(pk=job.pk).update(run_at="2000-01-01T00:00:00Z")
    second = claim("host-b:2")

    with pytest.raises(RuntimeError, match="after the mail"):
        with transaction.atomic():
            effects.send_mail(second.ctx, "notice", "Ready", "Your file", ["a@b.c"])
            raise RuntimeError("the handler fails after the mail")

    assert len(mail.outbox) == 1
    resent = JobEvent.objects.filter(job=job, type="mail_resent", attempt=2)
    assert resent.count() == 1  # the possible duplicate stays recorded through the rollback
    row = IdempotencyKey.objects.get(key=f"{job.pk}:notice")
    assert (row.status, row.kind, row.performs, row.attempt) == ("done", "mail", 2, 2)
