"""Intents and the outbox relay: for downstreams that can neither check tokens nor deduplicate.

Owns: `ctx.intent(step, target, data)` (kept in memory until the commit, jobs/effects/pending.py),
the relay the embedded scheduler runs, the target registry (a built-in `webhook` target) and the
outbox counts /metrics exports.

An intent becomes a row only inside the fenced commit statement that ends its attempt
(jobs/core/sql/: inserted by a CTE joined on the committed rows), so a zombie's intents never exist.
The relay:
1. claims pending intents (and ones whose relay's lease ran out) with `FOR UPDATE SKIP LOCKED`,
   bumping `claims` -- its own fencing token -- and setting a lease from the database clock;
2. if an earlier claim started performing it (`performs > 0`) and the target can reconcile, asks
   the target whether the effect happened; if so the intent is done (`reconciled`), never
   performed again;
3. marks `performs` + 1 fenced by its token (a relay whose claim was taken over stops here),
   performs through the target, and marks the intent done, or schedules a retry with backoff,
   again fenced by its token.

Never: performs an intent without holding its current claim; trusts a relay's memory across a
crash -- the rows decide.

Hazards: a relay stalled past its lease while performing may overlap the next relay's
reconciliation; RELAY_LEASE_SECONDS is far above the targets' timeouts for that reason, and
every call carries the key "<job_id>:<step>" for receivers that can deduplicate after all.
"""

import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from jobs.core import bounds
from jobs.core.conf import jobs_settings
from jobs.core.exceptions import InvalidOption
from jobs.core.sql import IntentRow
from jobs.core.states import EventType
from jobs.effects.keys import checked_step, key_for
from jobs.models import Intent, JobEvent

logger = logging.getLogger("jobs.outbox")

RELAY_BATCH = 20
RELAY_CONCURRENCY = 4  # intents of one batch handled at once by the embedded relay
RELAY_LEASE_SECONDS = 60.0
MAX_FAILURES = 8  # then the intent is `failed` (shown; an operator decides)
BACKOFF_SECONDS = (1.0, 300.0)  # first retry, cap: doubling
MAX_INTENT_BYTES = 64 * 1024


class Target(Protocol):
    """What the relay calls. A target may also offer `reconcile(key, data) -> bool | None`:
    True, the effect happened; False, it did not; None, it cannot tell (performed again)."""

    def perform(self, key: str, data: Any) -> None: ...


@dataclass(frozen=True)
class Claim:
    id: int
    job_id: int
    attempt: int
    key: str
    target: str
    data: Any
    token: int  # the relay's fencing token: Intent.claims after this claim
    performs: int
    failures: int


_targets: dict[str, Target] = {}


def register_target(name: str, target: Target) -> None:
    """Register an outbox target by name (at import of a handlers module, in every process)."""
    if not re.fullmatch(r"[a-z][a-z0-9._-]{0,99}", name):
        raise InvalidOption(f"target name {name!r} must be lowercase letters, digits, . _ -")
    _targets[name] = target


def get_target(name: str) -> Target | None:
    return _targets.get(name)


def intent(step: str, target: str, data: Any, job_id: int) -> IntentRow:
    """Validate an intent (bounded like a payload) and return the row its commit will insert."""
    checked_step(step, "intent")
    if get_target(target) is None:
        raise InvalidOption(f"intent(): no outbox target is registered as {target!r:.100}")
    bounds.json_value(data, min(MAX_INTENT_BYTES, jobs_settings().MAX_PAYLOAD_BYTES), what="intent")
    return IntentRow(step, key_for(job_id, step), target, data)


# -- the relay ----------------------------------------------------------------------------------


def _later(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def claim(
    relay: str, limit: int = RELAY_BATCH, lease_seconds: float = RELAY_LEASE_SECONDS
) -> list[Claim]:
    due = Q(state=Intent.State.PENDING, next_try_at__lte=Now()) | Q(
        state=Intent.State.PERFORMING, lease_expires_at__lt=Now()
    )
    with transaction.atomic():
        # SKIP LOCKED: two relays take disjoint rows; a row is claimed by bumping its token.
        ids = list(
            Intent.objects.select_for_update(skip_locked=True)
            .filter(due)
            .order_by("next_try_at", "id")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return []
        Intent.objects.filter(pk__in=ids).update(
            state=Intent.State.PERFORMING,
            claims=F("claims") + 1,
            relay=relay[:200],
            lease_expires_at=_later(lease_seconds),
        )
        rows = Intent.objects.filter(pk__in=ids).order_by("id")
        return [
            Claim(
                r.pk, r.job_id, r.attempt, r.key, r.target, r.data, r.claims, r.performs, r.failures
            )
            for r in rows
        ]


def _fenced(c: Claim) -> Any:
    return Intent.objects.filter(pk=c.id, claims=c.token, state=Intent.State.PERFORMING)


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
            state=Intent.State.DONE, done_at=Now(), lease_expires_at=None, reconciled=reconciled
        )
        if ok:
            kind = EventType.INTENT_RECONCILED if reconciled else EventType.INTENT_PERFORMED
            _event(c, kind, relay, target=c.target)
    if not ok:
        logger.warning(
            "intent %s: claim %s was taken over; not marked by %s", c.key, c.token, relay
        )
    return bool(ok)


def _failed(c: Claim, relay: str, error: str) -> None:
    failures = c.failures + 1
    give_up = failures >= MAX_FAILURES
    delay = min(BACKOFF_SECONDS[0] * 2 ** (failures - 1), BACKOFF_SECONDS[1])
    with transaction.atomic():
        ok = _fenced(c).update(
            state=Intent.State.FAILED if give_up else Intent.State.PENDING,
            failures=failures,
            next_try_at=_later(delay),
            lease_expires_at=None,
            last_error=bounds.storable_error(error)[:2000],
        )
        if ok and give_up:
            _event(c, EventType.INTENT_FAILED, relay, error=error[-500:])
    logger.warning(
        "intent %s via %s failed (%s/%s): %s", c.key, c.target, failures, MAX_FAILURES, error
    )


def handle(c: Claim, relay: str, lease_seconds: float = RELAY_LEASE_SECONDS) -> str:
    """Reconcile if needed, perform, mark. Returns what happened (for tests and logs).

    Starting to perform renews the claim's lease, so every intent of a slow batch gets a whole
    lease (far above the target's timeout) from the moment its own call begins.
    """

    target = get_target(c.target)
    if target is None:
        _failed(c, relay, f"no outbox target is registered as {c.target!r} in this process")
        return "failed"
    if c.performs > 0 and hasattr(target, "reconcile"):
        try:
            happened = target.reconcile(c.key, c.data)
        except Exception as exc:  # noqa: BLE001  an unreachable downstream: try again later
            _failed(c, relay, f"reconciliation failed: {type(exc).__name__}: {exc}")
            return "failed"
        if happened:
            logger.info("intent %s: reconciliation found it performed; not performing again", c.key)
            return "reconciled" if _done(c, relay, reconciled=True) else "taken-over"
    if not _fenced(c).update(performs=F("performs") + 1, lease_expires_at=_later(lease_seconds)):
        return "taken-over"
    try:
        target.perform(c.key, c.data)
    except Exception as exc:  # noqa: BLE001  a target's failure is data: retried with backoff
        _failed(c, relay, f"{type(exc).__name__}: {exc}")
        return "failed"
    return "performed" if _done(c, relay, reconciled=False) else "taken-over"


def relay_once(
    relay: str,
    limit: int = RELAY_BATCH,
    lease_seconds: float = RELAY_LEASE_SECONDS,
    concurrency: int = 1,
) -> int:
    """Claim and handle one batch of due intents; return how many were claimed.

    With `concurrency` > 1 (the embedded relay: RELAY_CONCURRENCY) the batch's intents are
    handled on that many threads, each with its own database connection, so a slow or dead
    target holds up its own intents, not the others of its batch.
    """
    claims = claim(relay, limit, lease_seconds)
    if concurrency <= 1 or len(claims) <= 1:
        for c in claims:
            handle(c, relay, lease_seconds)
        return len(claims)
    with ThreadPoolExecutor(min(concurrency, len(claims)), thread_name_prefix="jobs-relay") as pool:
        for done in [
            pool.submit(_handle_on_own_connection, c, relay, lease_seconds) for c in claims
        ]:
            done.result()  # a database error surfaces to the relay loop's outage log
    return len(claims)


def _handle_on_own_connection(c: Claim, relay: str, lease_seconds: float) -> str:
    try:
        return handle(c, relay, lease_seconds)
    finally:
        connection.close()  # this pool thread's own connection: never left open


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


# -- the built-in webhook target -------------------------------------------------------------


class WebhookTarget:
    """POSTs `data["json"]` to `data["url"]` with the key in an `Idempotency-Key` header.

    Reconciliation (optional): with `data["check_url"]`, a GET of it with `?key=<key>` answering
    200 means the receiver has the effect, 404 that it has not. The URL comes from the handler's
    code: never build it from a job's payload without an allow-list.
    """

    def __init__(self, timeout: float = 10.0, opener: Callable[..., Any] | None = None) -> None:
        self.timeout = timeout
        self._open = opener or urllib.request.urlopen

    @staticmethod
    def _url(data: Any, name: str) -> str:
        url = data.get(name) if isinstance(data, dict) else None
        if not isinstance(url, str) or not re.match(r"https?://", url):
            raise InvalidOption(f"webhook: data[{name!r}] must be an http(s) URL")
        return url

    def perform(self, key: str, data: Any) -> None:
        body = json.dumps(data.get("json")).encode()
        request = urllib.request.Request(
            self._url(data, "url"),
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        )
        with self._open(request, timeout=self.timeout) as response:
            if not 200 <= response.status < 300:
                raise RuntimeError(f"webhook answered {response.status}")

    def reconcile(self, key: str, data: Any) -> bool | None:
        if not isinstance(data, dict) or "check_url" not in data:
            return None
        from urllib.parse import quote

        url = f"{self._url(data, 'check_url')}?key={quote(key)}"
        try:
            with self._open(urllib.request.Request(url), timeout=self.timeout) as response:
                return bool(200 <= response.status < 300)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise


register_target("webhook", WebhookTarget())
