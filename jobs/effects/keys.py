"""Effects: calls to the outside world made at most once per (job, step) across attempts.

Owns: the effect ledger (`jobs.IdempotencyKey`) and `ctx.effect(step, fn)`. The key is
`"<job_id>:<step>"` -- never the attempt -- so every attempt presents the same key and the
receiver can deduplicate. Ships one real effect: `send_mail`, Django's mail framework with the key
in the `Message-ID` -- at-least-once, since mail servers do not deduplicate: a second send of a
key is recorded (`mail_resent`), counted and logged.

How one effect runs:
1. begin (one short transaction): the job row held FOR KEY SHARE (`_no_flush_of_its_own`: a
   prune skips the job meanwhile), then the key row, locked with `select_for_update()`. Done
   already: the stored result is returned and `repeats` + 1 (deduplicated; `fn` is not called).
   Otherwise the job row is locked under this attempt's fence (`attempt = mine AND state =
   running`): a zombie is refused here before it calls anything. The row is created, or taken
   over from an earlier attempt that started the effect and never recorded completion
   (`performs` + 1).
2. `fn(key)` runs outside any transaction of ours. Whether an earlier attempt's call reached the
   receiver is unknown, so the receiver must deduplicate by key; a receiver that cannot must be
   reached through an intent (jobs/effects/outbox.py) instead.
3. finish: `UPDATE ... WHERE key = K AND attempt = mine AND status = 'started'`. An older attempt
   whose row a newer attempt took over changes zero rows: recorded as a stale `effect` write and
   raised as LeaseLost -- it can never record its completion over the newer attempt's. A row
   already done by this same attempt (a call nested in its own step's fn) returns its result.
   (One attempt's threads never run one step at once: jobs/effects/in_flight.py.)

Never: runs `fn` inside the ledger's transaction (the lock would last as long as the call).

Durability: the ledger's two transactions commit with `synchronous_commit = off` on PostgreSQL
(no WAL flush of their own). Losing them in a database crash can only make a later attempt call
`fn` again with the same key -- exactly what an effect that never recorded completion does, and
what the receiver must deduplicate anyway -- and the job's own commit (synchronous, later in the
same WAL) flushes them before the job can succeed. Mail is the exception that must not lose its
row: the row *is* the record of a possible duplicate and dates the Message-ID. So before a mail
leaves, a synchronous commit follows its `begin` (`_mark_mail`: the row marked "mail" on a
first send, the `mail_resent` event on a resend), and flushes it
(`test_the_ledger_row_is_on_disk_before_a_mail_leaves_first_send_and_resend`).
"""

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Now

from jobs.core import bounds
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import InvalidOption, LeaseLost
from jobs.core.states import EventType, JobState, Write
from jobs.core.transitions import Fence
from jobs.effects.fenced import record_rejection
from jobs.models import IdempotencyKey, Job, JobEvent

logger = logging.getLogger("jobs.effects")

STEP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def checked_step(step: Any, what: str = "effect") -> str:
    if not isinstance(step, str) or not STEP.fullmatch(step):
        raise InvalidOption(
            f"{what}(): step {step!r:.80} must be 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return step


def key_for(job_id: int, step: str) -> str:
    return f"{job_id}:{step}"


@dataclass(frozen=True)
class Begun:
    key: str
    done: bool
    result: Any = None


def begin(fence: Fence, step: str) -> Begun:
    key = key_for(fence.job_id, step)
    with transaction.atomic():
        _no_flush_of_its_own(fence.job_id)
        row = IdempotencyKey.objects.select_for_update().filter(key=key).first()
        if row is None or row.status != IdempotencyKey.Status.DONE:
            # The fence: this attempt still owns the job, held for the rest of this transaction.
            owned = (
                Job.objects.select_for_update(no_key=True)
                .filter(pk=fence.job_id, attempt=fence.attempt, state=JobState.RUNNING)
                .values_list("pk", flat=True)
            )
            if not list(owned):
                current = Job.objects.filter(pk=fence.job_id).values_list("attempt", flat=True)
                refused = (key, (current.first() or 0))
                row = None
            elif row is None:
                # Another call of this attempt's step (its threads, or nested) may have created
                # the row while this one waited for the fence: it has committed, so read again.
                row = IdempotencyKey.objects.select_for_update().filter(key=key).first()
                if row is None:
                    IdempotencyKey.objects.create(
                        key=key, job_id=fence.job_id, step=step, attempt=fence.attempt, performs=1
                    )
                    return Begun(key, False)
        if row is not None and row.status == IdempotencyKey.Status.DONE:
            IdempotencyKey.objects.filter(pk=row.pk).update(
                repeats=F("repeats") + 1, updated_at=Now()
            )
            JobEvent.objects.create(
                job_id=fence.job_id,
                attempt=fence.attempt,
                type=EventType.EFFECT_DEDUPLICATED,
                worker=fence.worker,
                data={"key": key, "performed_by": row.attempt},
            )
            return Begun(key, True, row.result)
        if row is not None:
            IdempotencyKey.objects.filter(pk=row.pk).update(
                attempt=fence.attempt, performs=F("performs") + 1, updated_at=Now()
            )
            return Begun(key, False)
    _refuse(fence, *refused)
    raise AssertionError("unreachable")


def finish(fence: Fence, key: str, result: Any) -> Any:
    """Record `result` as the effect's; returns the result recorded. A row this same attempt
    recorded meanwhile (two calls of one step at once, from its threads, or nested) is its own
    answer, not a stale write: its result comes back."""
    with transaction.atomic():
        _no_flush_of_its_own(fence.job_id)
        done = IdempotencyKey.objects.filter(
            key=key, attempt=fence.attempt, status=IdempotencyKey.Status.STARTED
        ).update(status=IdempotencyKey.Status.DONE, result=result, updated_at=Now())
        if done:
            JobEvent.objects.create(
                job_id=fence.job_id,
                attempt=fence.attempt,
                type=EventType.EFFECT_PERFORMED,
                worker=fence.worker,
                data={"key": key},
            )
            return result
        row = IdempotencyKey.objects.filter(key=key).values("attempt", "status", "result").first()
    own = (fence.attempt, IdempotencyKey.Status.DONE)
    if row is not None and (row["attempt"], row["status"]) == own:
        return row["result"]  # this attempt's own other call of the step recorded it
    _refuse(fence, key, row["attempt"] if row else 0)


def _no_flush_of_its_own(job_id: int) -> None:
    """The ledger transaction's first statement (PostgreSQL): no WAL flush of its own, and the
    job row held FOR KEY SHARE before the key row is locked. A prune then skips the job, or this
    waits for the prune and finds the key row gone. Without it, an event this transaction
    committed while the prune's cascade waited for the key row (a zombie's `effect_deduplicated`
    or `effect_performed`) was missed by that one statement's snapshot: left for a deleted job."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute(
                "SELECT set_config('synchronous_commit', 'off', true), "
                "EXISTS (SELECT 1 FROM jobs_job WHERE id = %s FOR KEY SHARE)",
                [job_id],
            )


def _refuse(fence: Fence, key: str, attempt_current: int) -> None:
    record_rejection(fence, Write.EFFECT, f"effect {key}", attempt_current)
    raise LeaseLost(fence.job_id, fence.attempt, Write.EFFECT)


def checked_result(result: Any) -> Any:
    """The result as its check read it, in plain JSON types: what the ledger stores and what
    `ctx.effect` returns, on this attempt as on any later one (the object itself could read
    differently when encoded again)."""
    return json.loads(bounds.json_text(result, jobs_settings().MAX_PAYLOAD_BYTES, "effect result"))


MAIL_DOMAIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}\.)*[A-Za-z0-9-]{1,63}")


def mail_domain() -> str:
    """The right part of every Message-ID: `settings.JOBS_MAIL_DOMAIN`, else one derived from
    this install's SECRET_KEY -- never a constant shared by every install."""
    configured = getattr(settings, "JOBS_MAIL_DOMAIN", "") or ""
    if configured:
        if not isinstance(configured, str) or len(configured) > 200:
            raise InvalidOption("JOBS_MAIL_DOMAIN must be a host name of at most 200 characters")
        if not MAIL_DOMAIN.fullmatch(configured):
            raise InvalidOption(f"JOBS_MAIL_DOMAIN {configured!r:.80} is not a host name")
        return configured
    secret = str(settings.SECRET_KEY).encode()
    return f"{hashlib.sha256(b'palisade-message-id:' + secret).hexdigest()[:16]}.palisade.invalid"


def _mail_started(fence: Fence, key: str) -> str:
    """Mark the key's row as mail and return its Message-ID; a second send of the key (an earlier
    attempt started it and never recorded completion) is recorded, logged and counted.

    Fenced: only while the row is still this attempt's own begin (started, under its attempt) and
    this attempt still owns the job. A zombie whose row a newer attempt took over (that attempt
    sends and records the resend itself), or whose job moved on, is refused here before it sends:
    so one begin makes at most one send and one `mail_resent` event. Before, a zombie waking
    between its begin and this mark read the newer attempt's `performs`, recorded a second
    `mail_resent` event for that one possible duplicate, and sent."""
    marked = _mark_mail(fence, key)
    if marked is None:
        current = Job.objects.filter(pk=fence.job_id).values_list("attempt", flat=True)
        _refuse(fence, key, current.first() or 0)
        raise AssertionError("unreachable")
    performs, message_id = marked
    if performs > 1:
        logger.warning(
            "mail %s sent again (send %s, same Message-ID %s): an earlier attempt may have "
            "delivered it -- a duplicate the recipient may see",
            key,
            performs,
            message_id,
        )
    return message_id


def _mark_mail(fence: Fence, key: str) -> tuple[int, str] | None:
    """The mark, in one transaction: (sends so far, Message-ID), or None (refused: nothing kept)."""
    # Synchronous (not `_no_flush_of_its_own`): on a first send this commit flushes the ledger's
    # `begin` (its own commit did not) before the mail leaves; on a resend the `mail_resent`
    # event's does. Locks the key row, then the job's: begin's order.
    with transaction.atomic():
        marked = IdempotencyKey.objects.filter(
            key=key, attempt=fence.attempt, status=IdempotencyKey.Status.STARTED
        ).update(kind="mail")
        owned = (
            Job.objects.select_for_update(no_key=True)
            .filter(pk=fence.job_id, attempt=fence.attempt, state=JobState.RUNNING)
            .values_list("pk", flat=True)
        )
        if not marked or not list(owned):
            transaction.set_rollback(True)
            return None
        row = IdempotencyKey.objects.filter(key=key).values("performs", "created_at").get()
        performs, stamp = row["performs"], int(row["created_at"].timestamp() * 1_000_000)
        message_id = f"<{key.replace(':', '.')}.{stamp}@{mail_domain()}>"
        if performs > 1:
            JobEvent.objects.create(
                job_id=fence.job_id,
                attempt=fence.attempt,
                type=EventType.MAIL_RESENT,
                worker=fence.worker[:200],
                data={"key": key, "message_id": message_id, "sends": performs},
            )
        return performs, message_id


def send_mail(
    ctx: Any,
    step: str,
    subject: str,
    body: str,
    to: list[str],
    from_email: str | None = None,
) -> dict[str, Any]:
    """Send one mail per (job, step), at least once: every possible duplicate is recorded.

    A repeat after a recorded send (a later attempt, or a zombie) gets the recorded result and
    sends nothing. A mail an earlier attempt started to send without recording the result (it
    may or may not have reached the server) is sent again with the same Message-ID -- mail
    servers do not deduplicate, so the recipient may get it twice -- and that send is recorded
    (a `mail_resent` event, counted by /metrics as `jobs_mail_resent_total`, marked on the job
    page) and logged.
    """

    def message(key: str, message_id: str) -> EmailMessage:
        headers = {"Message-ID": message_id, "X-Idempotency-Key": key}
        return EmailMessage(subject, body, from_email, to, headers=headers)

    if ".." in checked_step(step) or step.endswith("."):
        # The Message-ID's left part is a dot-atom (RFC 5322): no empty part between its dots.
        # Servers that require a valid Message-ID (Gmail) refuse, or rewrite, one that is not.
        raise InvalidOption(
            f"send_mail(): step {step!r} would make an invalid Message-ID: no '..', no final '.'"
        )
    try:  # what the framework refuses (a line break in a header, `to` not a list) is refused
        # before the ledger row: never a send started, so never recorded as sent again
        checked = message(key_for(ctx.job_id, step), f"<check@{mail_domain()}>")
        checked.message()
    except (TypeError, ValueError) as exc:
        raise InvalidOption(f"send_mail(): {exc}"[:500]) from exc
    to = checked.to  # read once: an iterator (`map(...)`) would reach the send empty, sent=0
    if not checked.recipients():
        # The framework's send() returns 0 without a word when its `to`, `cc` and `bcc` hold no
        # address (empty or only ""): the effect would be recorded as done, nothing ever sent.
        raise InvalidOption(f"send_mail(): no recipient: `to` holds no address ({to!r:.80})")

    def send(key: str) -> dict[str, Any]:
        # Outside the handler's own transaction, like the ledger's begin and finish. Inside it,
        # the mark locked the key row until that transaction ended: finish, on the context's own
        # connection, waited for it until its deadline cut it (the mail sent, nothing recorded),
        # and the rollback erased the record of a possible duplicate.
        started: list[str] = []
        fence = Fence(ctx.job_id, ctx.attempt, str(ctx.worker))
        ctx._outside_transaction(lambda: started.append(_mail_started(fence, key)))
        message_id = started[0]
        sent = message(key, message_id).send()
        return {"sent": sent, "message_id": message_id}

    result: dict[str, Any] = ctx.effect(step, send)
    return result
