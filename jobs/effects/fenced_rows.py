"""Token-checked INSERTs and DELETEs of the application's own rows (ctx.fenced_create,
ctx.fenced_bulk_create, ctx.fenced_delete), beside fenced.py's UPDATEs.

Owns: the statements that insert or delete rows of a `jobs.models.FencedRow` model only while
the presenting attempt is the job's *current* attempt and the job is `running`.

- An INSERT is `INSERT INTO t (cols) SELECT <values> WHERE EXISTS (<the job at this attempt,
  running>) RETURNING ...`: a refused one inserts nothing. The values are Django's own (the
  model's defaults, `pre_save()` such as `auto_now`, each field's `get_db_prep_save()`), and the
  row's fence columns are this attempt's. No `save()` and no signals, as with `bulk_create()`. A
  bulk create is one such statement per row in one savepoint: all rows or none.
- A DELETE locks its rows (FOR UPDATE, primary-key order, at most MAX_ROWS), then deletes them
  with the job check and fenced_write's token rule in the DELETE's own filter (no row last
  written by a higher attempt of this job: a zombie may not remove what its successor wrote).
  All or nothing: fewer rows deleted than locked rolls the savepoint back. Django's collector
  runs as for `QuerySet.delete()`: with no cascade and no delete signal it is that one DELETE;
  otherwise the filter decides at the SELECT that collects the rows, and cascaded rows go with
  their parent, checked by the job alone.

Decided again at the COMMIT on PostgreSQL, by the same deferred trigger as an UPDATE
(jobs/core/sql/fenced.py): an inserted row by its own token, a delete by the deleter named in
the transaction-local setting `DELETERS`. A refusal at either point is a `TokenDecision` with
`refused`; the context records it and raises LeaseLost. The application's own constraint
violations (a duplicate name) stay the IntegrityError they are: a refused INSERT inserts no
row, so it meets no constraint.

Never: inserts a multi-table child (its parent's row would need a second, unchecked INSERT).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Exists
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery

from jobs.core.exceptions import InvalidOption
from jobs.core.sql import fenced as fenced_sql
from jobs.core.states import JobState
from jobs.core.transitions import Fence
from jobs.effects import fenced
from jobs.effects.fenced import TokenDecision
from jobs.models import FencedRow, Job


@dataclass(frozen=True)
class Created:
    """What a token-checked create did: every instance inserted, or none (`decision.refused`)."""

    decision: TokenDecision
    instances: list[Any] = field(default_factory=list)


def _fenced_model(call: str, model: Any) -> None:
    if not isinstance(model, type) or not issubclass(model, FencedRow):
        raise InvalidOption(f"{call}(): {model!r} must be a model with the FencedRow mixin")


def _commit_check(db: str, model: Any) -> None:
    if connections[db].vendor == "postgresql" and (
        missing := fenced.commit_check_missing(db, model)
    ):
        raise InvalidOption(missing)


def _refused(db: str, fence: Fence, resource: str) -> TokenDecision:
    now = Job.objects.using(db).filter(pk=fence.job_id).values_list("attempt", "state")
    attempt_current, state_current = now.first() or (None, "deleted")
    return TokenDecision(0, True, resource, attempt_current, state_current)


def _insert(conn: Any, db: str, obj: Any, fence: Fence) -> tuple[str, list[Any], list[Any]]:
    """`obj`'s INSERT, decided by the job check in its own WHERE: SQL, params, returned fields."""
    meta = obj._meta.concrete_model._meta
    if obj.pk is None:
        obj.pk = meta.pk.get_pk_value_on_save(obj)
    candidates = [
        f
        for f in meta.local_concrete_fields
        if not f.generated and (obj.pk is not None or f is not meta.auto_field)
    ]
    query = InsertQuery(meta.model)
    query.insert_values(candidates, [obj])
    compiler = query.get_compiler(db)
    fields, values, returning = [], [], list(meta.db_returning_fields)
    for f in candidates:
        value = compiler.pre_save_val(f, obj)
        if isinstance(value, DatabaseDefault) or hasattr(value, "resolve_expression"):
            if f not in returning:
                returning.append(f)
            if isinstance(value, DatabaseDefault):
                continue  # left out: the column's default applies
        fields.append(f)
        values.append(compiler.prepare_value(f, value))
    placeholders, params = compiler.assemble_as_sql(fields, [values])
    qn = conn.ops.quote_name
    returning_sql, returning_params = conn.ops.returning_columns(returning)
    sql = (
        f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
        f"SELECT {', '.join(placeholders[0])} WHERE EXISTS (SELECT 1 FROM "
        f"{qn(Job._meta.db_table)} WHERE id = %s AND attempt = %s AND state = %s) {returning_sql}"
    )
    job_check = [fence.job_id, fence.attempt, JobState.RUNNING.value]
    return sql, [*params[0], *job_check, *returning_params], returning


def _assign(obj: Any, row: Sequence[Any], returning: list[Any], db: str) -> None:
    compiler = InsertQuery(type(obj)).get_compiler(db)
    cols = [f.get_col(f.model._meta.db_table) for f in returning]
    if converters := compiler.get_converters(cols):
        row = next(iter(compiler.apply_converters([row], converters)))
    for value, f in zip(row, returning, strict=True):
        setattr(obj, f.attname, value)
    obj._state.adding, obj._state.db = False, db


def create(fence: Fence, model: Any, rows: Sequence[Mapping[str, Any]]) -> Created:
    """Insert one instance of `model` per mapping of `rows` if this attempt still owns the job,
    else none of them."""
    _fenced_model("fenced_create", model)
    db = router.db_for_write(model)
    _commit_check(db, model)
    if model._meta.concrete_model._meta.parents:
        raise InvalidOption(
            f"fenced_create(): {model._meta.label} is a multi-table child; create its parent"
        )
    if len(rows) > fenced.MAX_ROWS:
        raise InvalidOption(f"fenced_bulk_create(): more than {fenced.MAX_ROWS} rows in one call")
    if any(set(fenced_sql.COLUMNS) & set(values) for values in rows):
        raise InvalidOption("fenced_create(): the fence columns are set by the write itself")
    objs = [
        model(**values, fence_job_id=fence.job_id, fence_attempt=fence.attempt) for values in rows
    ]
    for obj in objs:  # an unsaved related object is refused, as by save() and bulk_create()
        obj._prepare_related_fields_for_save(operation_name="fenced_create")
    conn, resource = connections[db], f"{model._meta.label}:insert"
    postgres = conn.vendor == "postgresql"
    current = Job.objects.using(db).filter(
        pk=fence.job_id, attempt=fence.attempt, state=JobState.RUNNING
    )
    try:
        with transaction.atomic(using=db):
            if not objs:  # nothing to insert: the job alone decides -- a zombie is told too
                if current.exists():
                    return Created(TokenDecision(0, False, resource))
            else:
                with conn.cursor() as cur:
                    if postgres:  # the COMMIT checks again the rows these INSERTs add
                        cur.execute(fenced_sql.MARK)
                    for obj in objs:
                        sql, params, returning = _insert(conn, db, obj, fence)
                        cur.execute(sql, params)
                        got = conn.ops.fetch_returned_rows(cur, ())
                        if not got:
                            break  # refused: the job moved on
                        _assign(obj, got[0], returning, db)
                    else:
                        if postgres:
                            cur.execute(fenced_sql.UNMARK)
                        return Created(TokenDecision(len(objs), False, resource), objs)
            transaction.set_rollback(True, using=db)
    except IntegrityError as exc:
        if fenced.refused_at_commit(exc) is None:  # the application's own constraint
            raise
    return Created(_refused(db, fence, resource))


def delete(fence: Fence, queryset: models.QuerySet[Any]) -> TokenDecision:
    """Delete every row of `queryset` if this attempt still owns the job, else none of them."""
    model = queryset.model
    _fenced_model("fenced_delete", model)
    db, rows, current, token_allows = fenced.target(fence, queryset)
    _commit_check(db, model)
    conn = connections[db]
    postgres, resource = conn.vendor == "postgresql", f"{model._meta.label}:delete"
    fence_label = fenced._fence_model(model)._meta.label
    try:
        with transaction.atomic(using=db):
            targets = rows.filter(pk__in=queryset.values("pk")).order_by("pk")
            pks = list(
                targets.select_for_update().values_list("pk", flat=True)[: fenced.MAX_ROWS + 1]
            )
            if len(pks) > fenced.MAX_ROWS:
                raise InvalidOption(
                    f"fenced_delete(): more than {fenced.MAX_ROWS} rows in one call"
                )
            resource = f"{resource} {','.join(str(pk) for pk in pks)}"[:200]
            if not pks:  # nothing to delete: the job alone decides
                if current.exists():
                    return TokenDecision(0, False, resource)
            else:
                if postgres:  # the COMMIT checks again that this fence still owns the job
                    with conn.cursor() as cur:
                        cur.execute(fenced_sql.MARK_DELETE)
                        cur.execute(
                            fenced_sql.DELETER, {"fence": f"{fence.job_id}:{fence.attempt}"}
                        )
                _, per_model = (
                    rows.filter(pk__in=pks).filter(token_allows, Exists(current)).delete()
                )
                if postgres:
                    with conn.cursor() as cur:
                        cur.execute(fenced_sql.UNMARK)
                # Django counts a proxy's rows under its label, a child's under both tables'.
                deleted = max(per_model.get(fence_label, 0), per_model.get(model._meta.label, 0))
                if deleted == len(pks):
                    return TokenDecision(len(pks), False, resource)
            transaction.set_rollback(True, using=db)
    except IntegrityError as exc:
        if fenced.refused_at_commit(exc) is None:
            raise
    return _refused(db, fence, resource)
