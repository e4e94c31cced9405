"""Token-checked writes to the application's own tables, and the record of any stale write
that is not a job-row write (token writes, effect completions).

Owns: `ctx.fenced_write(queryset, **values)` on models with the `jobs.models.FencedRow` mixin
(its INSERTs and DELETEs: fenced_rows.py), and the installation of the COMMIT's check.
A write is accepted only while the presenting attempt is the job's *current* attempt and the job
is `running` -- an `EXISTS` on the job row inside the UPDATE itself -- and, beside it, only for
rows whose own token allows it: last written by another job (or none), or by this job at an
attempt no higher than ours (equal: an idempotent retry of the same attempt). The row's token
alone is not enough: after another job wrote the row it no longer remembers this job's attempts
(the cross-job ABA), and a row the winner never wrote carries no token of it.

All or nothing: the target rows are first locked (SELECT ... FOR UPDATE, in primary-key order
so two writers cannot deadlock), then one UPDATE decides; if it changed fewer rows than were
locked, the savepoint rolls back and nothing of the write remains. The lock comes first so the
UPDATE's snapshot is taken after every racing writer of those rows committed: its job check then
sees any reclaim those writers depended on (a zombie whose statement started before a newer
attempt committed cannot change one row and be refused on the other).

Never: reads a row into Python and saves it back; retries a refused write.

Decided twice on PostgreSQL: by the UPDATE, and again by the COMMIT of the transaction it ran in
(jobs/core/sql/fenced.py: a deferred constraint trigger on each FencedRow table, installed after
every `migrate` by `install_commit_checks`). Inside the handler's own transaction the rows become
visible only at its COMMIT; a job taken over in between makes that COMMIT fail
(IntegrityError, constraint jobs_fence_at_commit) and roll the whole transaction back --
`refused_at_commit` tells that error apart, and the context records it like a refused UPDATE.
A FencedRow table without its trigger is refused before it is written (`commit_check_missing`).

Hazards: `record_rejection` must not join the handler's transaction -- the context runs it on a
connection of its own -- so the record survives the handler's rollback.
"""

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.apps import apps
from django.db import (
    DEFAULT_DB_ALIAS,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    connections,
    models,
    router,
    transaction,
)
from django.db.models import Exists, Q

from jobs.core import transitions
from jobs.core.exceptions import InvalidOption
from jobs.core.sql import driver_for
from jobs.core.sql import fenced as fenced_sql
from jobs.core.states import EventType, JobState
from jobs.core.transitions import Fence
from jobs.models import FencedRow, Job, JobEvent, RejectedWrite

logger = logging.getLogger("jobs.fencing")

# At most this many rows per call: their keys are held in memory and sent back in the UPDATE, and
# every one is locked until the write's transaction ends.
MAX_ROWS = 10_000


@dataclass(frozen=True)
class TokenDecision:
    """What one token-checked write did: all its rows updated, or none (`refused`)."""

    updated: int
    refused: bool
    resource: str  # "<app.Model>:<pk>,<pk>..." (bounded), for the record of a refusal
    attempt_current: int | None = None  # the job's attempt when refused (None: job deleted)
    state_current: str = ""


class Target(NamedTuple):
    db: str  # where the routers send the queryset's writes
    rows: models.QuerySet[Any]  # the model's rows there, all of them (its base manager)
    current: models.QuerySet[Any]  # the job, while this attempt owns it and it runs
    token_allows: Q  # rows last written by another job (or none), or by this one at <= ours


def target(fence: Fence, queryset: models.QuerySet[Any]) -> Target:
    """What a token-checked UPDATE or DELETE of `queryset` checks, and where it writes: where
    the application's routers send this queryset's writes, as Django's update() does
    (`queryset.db` is its *read* alias: a replica behind a read-replica router)."""
    model = queryset.model
    hints = getattr(queryset, "_hints", None) or {}
    db = getattr(queryset, "_db", None) or router.db_for_write(model, **hints)
    current = Job.objects.using(db).filter(
        pk=fence.job_id, attempt=fence.attempt, state=JobState.RUNNING
    )
    token_allows = (
        Q(fence_job_id__isnull=True)
        | ~Q(fence_job_id=fence.job_id)
        | Q(fence_attempt__lte=fence.attempt)
    )
    # The base manager, not the default one: a default manager that hides rows (a soft
    # delete's) would leave rows of the queryset given unwritten, and the write not refused.
    return Target(db, model._base_manager.using(db), current, token_allows)


def write(fence: Fence, queryset: models.QuerySet[Any], **values: Any) -> TokenDecision:
    """Update every row of `queryset` if this attempt still owns the job, else none of them."""
    model = queryset.model
    if not issubclass(model, FencedRow):
        raise InvalidOption(
            f"fenced_write(): {model._meta.label} must use the jobs.models.FencedRow mixin"
        )
    if {"fence_job_id", "fence_attempt"} & set(values):
        raise InvalidOption("fenced_write(): the fence columns are set by the write itself")
    db, rows, current, token_allows = target(fence, queryset)
    conn = connections[db]
    postgres = conn.vendor == "postgresql"
    if postgres and (missing := commit_check_missing(db, model)):
        raise InvalidOption(missing)
    resource = model._meta.label
    try:
        with transaction.atomic(using=db):
            targets = rows.filter(pk__in=queryset.values("pk")).order_by("pk")
            pks = list(targets.select_for_update().values_list("pk", flat=True)[: MAX_ROWS + 1])
            if len(pks) > MAX_ROWS:
                raise InvalidOption(f"fenced_write(): more than {MAX_ROWS} rows in one call")
            resource = f"{model._meta.label}:{','.join(str(pk) for pk in pks)}"[:200]
            if not pks:  # nothing to write: the job alone decides -- a zombie is told too
                if current.exists():
                    return TokenDecision(0, False, resource)
            else:
                if postgres:  # the COMMIT checks again the rows this UPDATE changes
                    with conn.cursor() as cur:
                        cur.execute(fenced_sql.MARK)
                updated = (
                    rows.filter(pk__in=pks)
                    .filter(token_allows, Exists(current))
                    .update(**values, fence_job_id=fence.job_id, fence_attempt=fence.attempt)
                )
                if postgres:  # and no later UPDATE of the transaction
                    with conn.cursor() as cur:
                        cur.execute(fenced_sql.UNMARK)
                if updated == len(pks):
                    return TokenDecision(updated, False, resource)  # decided again at the COMMIT
            # Refused (wholly or for some row, or no row): undo whatever this UPDATE changed.
            transaction.set_rollback(True, using=db)
    except IntegrityError as exc:
        if refused_at_commit(exc) is None:  # no outer transaction: this COMMIT was the write's
            raise
    now = Job.objects.using(db).filter(pk=fence.job_id).values_list("attempt", "state")
    attempt_current, state_current = now.first() or (None, "deleted")
    return TokenDecision(0, True, resource, attempt_current, state_current)


def refused_at_commit(exc: BaseException) -> str | None:
    """If `exc` (or an exception it was raised from) is a COMMIT that refused a token-checked
    write, the label of the model written ("app.Model"), else None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, IntegrityError):
            label = _fence_refusal(exc.__cause__)
            if label is not None:
                return label
        exc, seen = exc.__cause__ or exc.__context__, seen + 1  # type: ignore[assignment]
    return None


def _fence_refusal(cause: BaseException | None) -> str | None:
    """The label if `cause` is the database's refusal by the fence's commit check, else None.
    A handler may raise anything from anything: a `diag` that is not psycopg's (or raises when
    read) is simply not ours, never an error of the drain."""
    try:
        diag = getattr(cause, "diag", None)
        if diag is None or diag.constraint_name != fenced_sql.CONSTRAINT:
            return None
        return str(diag.message_detail or "")[:200]
    except Exception:  # noqa: BLE001  a hostile attribute of the handler's own exception
        return None


# (alias, table) -> its trigger was seen, once per process.
_CHECKED: set[tuple[str, str]] = set()


def _fence_model(model: type[models.Model]) -> type[models.Model]:
    """The model whose table holds `model`'s fence columns (a multi-table child's parent)."""
    field = model._meta.get_field(fenced_sql.COLUMNS[0])
    return field.model  # type: ignore[no-any-return]


def commit_check_missing(using: str, model: type[models.Model]) -> str:
    """Why `model`'s table cannot take a token-checked write (its COMMIT's check is not
    installed, is disabled or is an older version's: run `manage.py migrate`), or "" -- asked
    once per process and table."""
    meta = _fence_model(model)._meta
    if (using, meta.db_table) in _CHECKED:
        return ""
    if not _trigger_current(connections[using], meta):
        return (
            f"fenced_write(): {model._meta.label}'s table {meta.db_table} has no enabled "
            f"{fenced_sql.TRIGGER}* triggers of this version, the check its writes' COMMIT makes: "
            "run `manage.py migrate` (which installs it on every FencedRow table that exists)"
        )
    _CHECKED.add((using, meta.db_table))
    return ""


def _trigger_current(conn: Any, meta: Any) -> bool:
    """Whether `meta`'s table carries this version's checks, enabled (an older one checks
    UPDATEs only)."""
    table = conn.ops.quote_name(meta.db_table)
    with conn.cursor() as cur:
        for name in fenced_sql.TRIGGERS:
            cur.execute(fenced_sql.TRIGGER_STATE, [table, name])
            digest = fenced_sql.install_trigger(table, meta.label, True, name)[1]
            if cur.fetchone() != (digest, True):
                return False
    return True


def _fence_tables(conn: Any) -> list[Any]:
    """The `_meta` of each model whose table holds FencedRow columns and exists on `conn` with
    both of them (one per table; managed or not; a multi-table child's is its parent's)."""
    tables = set(conn.introspection.table_names())
    found: dict[str, Any] = {}
    for model in apps.get_models():
        if not issubclass(model, FencedRow) or model._meta.proxy:
            continue
        meta = _fence_model(model)._meta
        if meta.db_table in found or meta.db_table not in tables:
            continue
        with conn.cursor() as cur:
            columns = {c.name for c in conn.introspection.get_table_description(cur, meta.db_table)}
        if set(fenced_sql.COLUMNS) <= columns:  # else: migrated back before the mixin came
            found[meta.db_table] = meta
    return list(found.values())


def _function_installed(conn: Any) -> bool:
    with conn.cursor() as cur:
        cur.execute(fenced_sql.FUNCTION_EXISTS)
        return bool(cur.fetchone()[0])


def install_commit_checks(using: str = DEFAULT_DB_ALIAS, **_: Any) -> list[str]:
    """Create the COMMIT's check on every FencedRow table (`_fence_tables`) of `using`
    (PostgreSQL; a `post_migrate` receiver, jobs.apps), where it is missing, disabled or differs
    from this version's. Returns the labels (re)installed."""
    conn = connections[using]
    if conn.vendor != "postgresql" or not _function_installed(conn):  # before 0023: nothing
        return []
    installed: list[str] = []
    for meta in _fence_tables(conn):
        table = conn.ops.quote_name(meta.db_table)
        changed = False
        for name in fenced_sql.TRIGGERS:
            with conn.cursor() as cur:
                cur.execute(fenced_sql.TRIGGER_STATE, [table, name])
                state = cur.fetchone()
                create, digest = fenced_sql.install_trigger(
                    table, meta.label, state is not None, name
                )
                if state is not None and state == (digest, True):
                    continue  # as it should be: no lock taken on the application's table
                cur.execute(create)
                changed = True
        if changed:
            installed.append(meta.label)
    return installed


def commit_checks_missing(using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The FencedRow tables of `using` whose COMMIT's check is missing, disabled or an older
    version's (labels): their token-checked writes are refused until `migrate` installs it (a
    system check)."""
    conn = connections[using]
    if conn.vendor != "postgresql":
        return []
    return [meta.label for meta in _fence_tables(conn) if not _trigger_current(conn, meta)]


def record_rejection(fence: Fence, write_: str, resource: str, attempt_current: int | None) -> None:
    """Store and log a stale write to something other than the job row, like every other
    (`attempt_current` None: the job's attempt as it is now). A connection lost during the
    COMMIT: the row is looked for on a new connection and logged if it landed, as
    jobs.core.transitions.record does."""
    stored: list[int] = []
    try:
        with transaction.atomic():
            with connection.cursor() as cur:  # held: a prune skips the job or has deleted it
                now = driver_for(connection.vendor).job_now(cur, fence.job_id)
            if now is None:
                return
            if attempt_current is None:
                attempt_current = now[0]
            state = now[1]
            row = RejectedWrite.objects.create(
                job_id=fence.job_id,
                attempt_presented=fence.attempt,
                attempt_current=attempt_current,
                state_current=state,
                worker=fence.worker,
                write=write_,
                resource=resource[:200],
            )
            JobEvent.objects.create(
                job_id=fence.job_id,
                attempt=fence.attempt,
                type=EventType.REJECTED,
                worker=fence.worker,
                data={
                    "write": write_,
                    "attempt_current": attempt_current,
                    "state_current": state,
                    "resource": resource[:200],
                },
            )
            stored.append(row.pk)
    except (OperationalError, InterfaceError):
        if not transitions.rejection_landed(stored[0] if stored else None):
            raise
    fields = {  # the job-row rejection's fields (jobs.core.transitions.fence.record), + resource
        "event": "stale_write_rejected",
        "write": write_,
        "job_id": fence.job_id,
        "attempt_presented": fence.attempt,
        "attempt_current": attempt_current,
        "state_current": str(state),
        "worker": fence.worker,
        "resource": resource[:200],
    }
    logger.warning(
        "stale %(write)s rejected: job=%(job_id)s attempt_presented=%(attempt_presented)s "
        "attempt_current=%(attempt_current)s resource=%(resource)s worker=%(worker)s",
        fields,
        extra={"fields": fields},
    )
