"""Intents and the outbox relay: for downstreams that can neither check tokens nor deduplicate.

Owns: `ctx.intent(step, target, data)` (kept in memory until the commit, jobs/effects/pending.py),
what the relay does with one claimed intent (the targets it calls: jobs/effects/targets.py),
operator retries (jobs/ops/intents.py), the outbox counts /metrics exports. When the relay runs,
how many calls at once per target: jobs/effects/relay.py.

An intent becomes a row only inside the fenced commit statement that ends its attempt
(jobs/core/sql/: inserted by a CTE joined on the committed rows), so a zombie's intents never exist.
The relay:
1. claims due intents (and ones whose relay's lease ran out) with `FOR UPDATE SKIP LOCKED`,
   bumping `claims` -- its own fencing token, presented to the target on every call;
2. if an earlier call's outcome is unknown (`outcome_unknown`: a timeout, a cut connection, a
   relay that died mid-call), asks the target whether the effect happened: yes -> `done`
   (`reconciled`); "cannot tell yet" -> asked again later, with backoff; no -> performed. A
   target that cannot check parks the intent `failed` for an operator: never performed again
   on the relay's own judgement;
3. marks `performs` + 1 and `outcome_unknown` fenced by its token (a relay whose claim was taken
   over stops here), performs, and marks the intent done -- or, on a refusal (`Refused`: not
   performed) or any other error or answer but None/True (the outcome is unknown: PERFORM_CONTRACT),
   schedules the next try with backoff
   (1 s doubling, capped at BACKOFF_CAP) until `JOBS["INTENT_RETRY_HOURS"]` after the commit
   (or the operator's retry), then marks it `failed`.

Never: performs or checks an intent without holding its current claim, nor checks with the
token of a call that may still be in flight (reclaim() takes a higher one); trusts a relay's
memory across a crash -- the rows decide; deletes an intent. Hazards: a relay stalled past its
lease may still call the target after the next relay's claim: the target tells them apart by
the relay token (the receiver contract, docs/effects.md).
"""

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from jobs.core import bounds, lanes
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import InvalidOption
from jobs.core.sql import IntentRow
from jobs.core.sql.rows import JSONText
from jobs.core.states import EventType
from jobs.effects.keys import checked_step, key_for
from jobs.effects.targets import Target, get_target, register_target, said
from jobs.effects.targets import call as call_target
from jobs.effects.webhook import OutcomeUnknown, Refused, WebhookTarget
from jobs.models import Intent, JobEvent

logger = logging.getLogger("jobs.outbox")

RELAY_BATCH = 20
RELAY_LEASE_SECONDS = 60.0  # far above a call's deadline (the relay's, 30 s, for every target)
BACKOFF_FIRST, BACKOFF_CAP = 1.0, 300.0  # seconds: doubling from the first, capped
MAX_INTENT_BYTES = 64 * 1024
PERFORM_CONTRACT = "a failed perform must raise: Refused if it certainly did not happen"
MAX_ERROR_CHARS = 2000
# An intent kept claimed while its call runs on past the relay's deadline (operators read it).
OVERDUE_NOTE = (
    "its call went past the relay's {:g} s deadline: kept claimed by {} until that call ends "
    "(its answer decides the intent; none recorded: reconciled)"
)


@dataclass(frozen=True)
class Claim:
    id: int
    job_id: int
    attempt: int
    key: str
    target: str
    data: Any
    lane: str  # as stored (jobs.core.lanes): what the relay counts calls in flight by
    token: int  # the relay's fencing token: Intent.claims after this claim
    performs: int
    failures: int
    outcome_unknown: bool = False


def _call(c: Claim, target: Any, method: str) -> Any:
    return call_target(c.target, target, method, c.key, c.data, c.token)


def intent(step: str, target: str, data: Any, job_id: int) -> IntentRow:
    """Validate an intent (bounded like a payload); the row its commit inserts holds the JSON text
    the check encoded, so what the handler does to `data` afterwards changes nothing recorded."""
    checked_step(step, "intent")
    found = get_target(target) if isinstance(target, str) else None  # a list: no name either
    if found is None:
        raise InvalidOption(f"intent(): no outbox target is registered as {target!r:.100}")
    limit = min(MAX_INTENT_BYTES, jobs_settings().MAX_PAYLOAD_BYTES)
    text = bounds.json_text(data, limit, "intent")
    stored = json.loads(text)  # the data as stored: what names the lane, what the target checks
    lane = lanes.lane(target, stored)  # never raises: a bad URL is a lane too
    if (validate := getattr(found, "validate", None)) is not None:
        validate(stored)
    return IntentRow(step, key_for(job_id, step), target, JSONText(text), lane)


# -- the relay ----------------------------------------------------------------------------------


def _later(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def backoff(failures: int) -> float:
    """Seconds before the next try after `failures` failed or unknown calls: 1 s doubling,
    capped at BACKOFF_CAP."""
    return min(BACKOFF_FIRST * 2 ** min(max(failures - 1, 0), 30), BACKOFF_CAP)


def _outside(full: list[str]) -> Q:
    """`lane NOT IN full`, spelled as ranges around each full lane: a range is what the index of
    open intents' lanes (jobs_intent_open_lane_idx) can serve, `<>` is not. A hanging receiver's
    backlog is then skipped in the index rather than walked row by row on every pump (20,000
    queued: 5 pages, not 1,800; test_a_full_lanes_backlog_costs_the_claim_nothing).
    Equal to `<>`: the column has a deterministic collation, so `<` or `>` is exactly not equal."""
    outside = Q()
    for lane in full:
        outside &= Q(lane__lt=lane) | Q(lane__gt=lane)
    return outside


def claim(
    relay: str,
    limit: int = RELAY_BATCH,
    lease_seconds: float = RELAY_LEASE_SECONDS,
    per_lane: int | None = None,
    busy: Mapping[str, int] | None = None,
) -> list[Claim]:
    """Claim up to `limit` due intents; with `per_lane`, at most that many per lane counting the
    `busy` calls this relay already has in flight (a full lane's intents are not even read).
    Lanes are the stored `Intent.lane` (jobs.core.lanes), compared by equality."""
    due = Q(state=Intent.State.PENDING, next_try_at__lte=Now()) | Q(
        state=Intent.State.PERFORMING, lease_expires_at__lt=Now()
    )
    taken = Counter(busy or {})
    with transaction.atomic():
        # SKIP LOCKED: two relays take disjoint rows; a row is claimed by bumping its token.
        rows = Intent.objects.select_for_update(skip_locked=True).filter(due)
        if per_lane is not None:
            full = [k for k, n in taken.items() if n >= per_lane]
            if full:
                rows = rows.filter(_outside(full))
        candidates = rows.order_by("next_try_at", "id").values_list("id", "lane")
        ids: list[int] = []
        for pk, lane in candidates[: limit * (4 if per_lane is not None else 1)]:
            if per_lane is not None:
                if taken[lane] >= per_lane:
                    continue
                taken[lane] += 1
            ids.append(pk)
            if len(ids) >= limit:
                break
        if not ids:
            return []
        Intent.objects.filter(pk__in=ids).update(
            state=Intent.State.PERFORMING,
            claims=F("claims") + 1,
            relay=relay[:200],
            lease_expires_at=_later(lease_seconds),
        )
        rows = Intent.objects.filter(pk__in=ids).annotate(token=F("claims")).order_by("id")
        return [Claim(*r) for r in rows.values_list(*(f.name for f in fields(Claim)))]


def _fenced(c: Claim) -> Any:
    return Intent.objects.filter(pk=c.id, claims=c.token, state=Intent.State.PERFORMING)


def reclaim(c: Claim, relay: str, lease_seconds: float = RELAY_LEASE_SECONDS) -> Claim | None:
    """Claim `c`'s intent again as the next relay would, with a higher token, so a check fences
    out the call `c` may still have in flight there; None once decided or taken over."""
    with transaction.atomic():
        bumped = _fenced(c).update(
            claims=F("claims") + 1, relay=relay[:200], lease_expires_at=_later(lease_seconds)
        )
        r = Intent.objects.get(pk=c.id) if bumped else None
    if r is None:
        return None
    return replace(c, token=r.claims, outcome_unknown=r.outcome_unknown, failures=r.failures)


def _event(c: Claim, type_: str, relay: str, **data: Any) -> None:
    JobEvent.objects.create(
        job_id=c.job_id,
        attempt=c.attempt,
        type=type_,
        worker=relay[:200],
        data={"key": c.key, **data},
    )


def _done(c: Claim, relay: str, reconciled: bool) -> bool:
    with transaction.atomic():
        ok = _fenced(c).update(
            state=Intent.State.DONE,
            done_at=Now(),
            lease_expires_at=None,
            reconciled=reconciled,
            outcome_unknown=False,
        )
        if ok:
            kind = EventType.INTENT_RECONCILED if reconciled else EventType.INTENT_PERFORMED
            _event(c, kind, relay, target=c.target)
    if not ok:
        logger.warning(
            "intent %s: claim %s was taken over; not marked by %s", c.key, c.token, relay
        )
    return bool(ok)


def _give_up(c: Claim, relay: str, error: str, failures: int, unknown: bool) -> bool:
    with transaction.atomic():
        ok = _fenced(c).update(
            state=Intent.State.FAILED,
            failures=failures,
            lease_expires_at=None,
            outcome_unknown=unknown,
            last_error=error,
        )
        if ok:
            _event(c, EventType.INTENT_FAILED, relay, error=error[-500:], unknown=unknown)
    if ok:
        logger.error("intent %s via %s given up (%s): %s", c.key, c.target, failures, error)
    else:
        logger.warning("intent %s: claim %s was taken over; %s not recorded", c.key, c.token, error)
    return bool(ok)


def _again(c: Claim, relay: str, error: str, unknown: bool) -> str:
    """Schedule the next try with backoff, or give up once the retry horizon has passed."""
    failures = c.failures + 1
    error = bounds.storable_error(error)[:MAX_ERROR_CHARS]
    horizon = timedelta(hours=jobs_settings().INTENT_RETRY_HOURS)
    within = ExpressionWrapper(Now() - horizon, output_field=DateTimeField())
    kept = (
        _fenced(c)
        .filter(retry_since__gt=within)
        .update(
            state=Intent.State.PENDING,
            failures=failures,
            next_try_at=_later(backoff(failures)),
            lease_expires_at=None,
            outcome_unknown=unknown,
            last_error=error,
        )
    )
    if not kept:
        return "failed" if _give_up(c, relay, error, failures, unknown) else "taken-over"
    what = "outcome unknown" if unknown else "failed"
    logger.warning("intent %s via %s %s (%s; retried): %s", c.key, c.target, what, failures, error)
    return "unknown" if unknown else "failed"


def keep_claim(c: Claim, relay: str, lease_seconds: float, deadline: float | None = None) -> str:
    """Renew `c`'s lease while its call, past the relay's deadline, is still out (the embedded
    relay, jobs/effects/relay.py), fenced by its token; the first time (`deadline`) the row says
    so in `last_error`. "kept", "decided" (the call marked it) or "taken-over"."""
    note = {"last_error": OVERDUE_NOTE.format(deadline, relay)} if deadline is not None else {}
    if _fenced(c).update(lease_expires_at=_later(lease_seconds), **note):
        return "kept"
    return (
        "taken-over" if Intent.objects.filter(pk=c.id, claims__gt=c.token).exists() else "decided"
    )


def ended_past_deadline(c: Claim, relay: str, seconds: float) -> str:
    """`c`'s call, kept claimed past the relay's deadline, ended without marking its intent (a
    database error, a bug): handed back with backoff as an unknown outcome, fenced by its token
    (the next try reconciles, the call being over)."""
    why = f"its call, out past the relay's {seconds:g} s deadline, ended with no answer recorded"
    return _again(c, relay, f"{why}: outcome unknown", unknown=True)


def not_started(c: Claim, relay: str, why: str) -> str:
    """`c`'s call never began (its thread did not start): handed back with backoff, its outcome
    as it was (nothing was sent, nor checked)."""
    return _again(c, relay, why, unknown=c.outcome_unknown)


def _reconcile(c: Claim, target: Any, relay: str) -> str | None:
    """An earlier call's outcome is unknown: decide from the target, never by performing again.
    Returns what happened, or None when the check proved the effect absent (perform it)."""
    if not hasattr(target, "reconcile"):
        happened = None
    else:
        try:
            happened = _call(c, target, "reconcile")
        except Exception as exc:  # noqa: BLE001  unreachable, or cannot tell yet: ask again later
            return _again(c, relay, f"reconciliation: {said(exc)}", unknown=True)
    if happened is None:
        why = (
            "an earlier call's outcome is unknown and the target cannot check it: "
            "not performed again (an operator's retry --perform-again would)"
        )
        return "parked" if _give_up(c, relay, why, c.failures, unknown=True) else "taken-over"
    if happened is not True and happened is not False:  # proves nothing (a falsy response)
        why = f"reconcile() answered a {type(happened).__name__}, not True, False or None"
        return _again(c, relay, f"reconciliation: {why}: cannot tell yet", unknown=True)
    if happened:
        logger.info("intent %s: reconciliation found it performed; not performing again", c.key)
        return "reconciled" if _done(c, relay, reconciled=True) else "taken-over"
    return None


def handle(
    c: Claim,
    relay: str,
    lease_seconds: float = RELAY_LEASE_SECONDS,
    renewed: Callable[[Claim], None] | None = None,
) -> str:
    """Reconcile if an earlier call's outcome is unknown, perform, mark. Returns what happened:
    performed, reconciled, unknown, failed, parked or taken-over (for tests and logs).

    Starting to perform renews the claim's lease, so every intent gets a whole lease (far above
    a call's deadline) from the moment its own call begins; `renewed(c)` is told then (the
    embedded relay times its deadline from it, jobs/effects/relay.py).
    """

    target = get_target(c.target)
    if target is None:
        return _again(c, relay, f"no outbox target {c.target!r} in this process", c.outcome_unknown)
    if c.outcome_unknown:
        decided = _reconcile(c, target, relay)
        if decided is not None:
            return decided
    started = _fenced(c).update(
        performs=F("performs") + 1, outcome_unknown=True, lease_expires_at=_later(lease_seconds)
    )
    if not started:
        return "taken-over"
    if renewed is not None:
        renewed(c)
    try:
        answer = _call(c, target, "perform")
    except Refused as exc:  # not performed: retried with backoff
        return _again(c, relay, said(exc), unknown=False)
    except Exception as exc:  # noqa: BLE001  may have happened: reconciled, never re-sent blind
        return _again(c, relay, said(exc), unknown=True)
    if answer is not None and answer is not True:  # False, a failed response...: maybe neither
        why = f"perform() returned a {type(answer).__name__}, not None ({PERFORM_CONTRACT})"
        return _again(c, relay, f"{why}: outcome unknown", unknown=True)
    return "performed" if _done(c, relay, reconciled=False) else "taken-over"


def relay_once(
    relay: str, limit: int = RELAY_BATCH, lease_seconds: float = RELAY_LEASE_SECONDS
) -> int:
    """Claim and handle one batch of due intents, one after the other, in this thread; return
    how many were claimed. (The embedded relay, jobs/effects/relay.py, never waits for a batch.)"""
    claims = claim(relay, limit, lease_seconds)
    for c in claims:
        handle(c, relay, lease_seconds)
    return len(claims)


# -- counts for /metrics -------------------------------------------------------------------------


def counts() -> dict[str, float]:
    """Outbox figures derived from the rows (correct across processes), for /metrics."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FILTER (WHERE state IN ('pending', 'performing')), "
            "COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(created_at) "
            "FILTER (WHERE state IN ('pending', 'performing'))), 0), "
            "COALESCE(sum(GREATEST(performs - 1, 0)), 0), "
            "count(*) FILTER (WHERE reconciled), "
            "count(*) FILTER (WHERE state = 'failed') "
            "FROM jobs_intent"
            if connection.vendor == "postgresql"
            else "SELECT sum(state IN ('pending', 'performing')), "
            "COALESCE((julianday('now') - julianday(min(CASE WHEN state IN ('pending', "
            "'performing') THEN created_at END))) * 86400, 0), "
            "COALESCE(sum(max(performs - 1, 0)), 0), sum(reconciled), sum(state = 'failed') "
            "FROM jobs_intent"
        )
        row = cur.fetchone()
    pending, oldest, reperforms, mismatches, failed = (float(v or 0) for v in row)
    return {
        "pending_intents": pending,
        "oldest_pending_age_seconds": max(oldest, 0.0),
        "relay_reperforms": reperforms,
        "reconciliation_mismatches": mismatches,
        "failed_intents": failed,
    }


__all__ = ["OutcomeUnknown", "Refused", "Target", "WebhookTarget", "get_target", "register_target"]
