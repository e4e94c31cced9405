"""PostgreSQL's one-statement enqueue, seen from the records: the row in, a real `Job` out.

Owns: turning an enqueue's row (jobs/core/enqueue.py `checked`, the one place of the rules) into
the columns, types and values Django's own INSERT would write -- taken from the model's fields, so
a column added later with a default needs nothing here -- sending the statement, and reading its
result back into a model instance with Django's converters: the whole row for a keyed job (it
may be the live holder's), for a keyless one only what the database decided (the id, the
defaults, READ_BACK), the rest taken from what was sent. The SQL text is
jobs/core/sql/enqueue.py's.

Never: validates, commits or opens a transaction (`Job.objects.enqueue()` is the caller, inside
the caller's transaction); never used on SQLite, which keeps the savepoint path.

An enqueue is on the hot path of applications, so everything derived from the model is computed
once per statement shape (`_Plan`: the columns, the values that are the same for every job, where
the row's own values go), and the statement is sent on the connection's own psycopg connection
with server-side binding, prepared once per connection (parse and plan skipped on every later
call) -- unless Django must see it (a query log, `execute_wrapper`s: then Django's cursor, never
prepared) or a prepared statement could reach the wrong server (jobs/models/prepared.py).
"""

import threading
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.fields import DateField, DateTimeField, Field
from django.db.models.sql import Query
from django.utils.asyncio import async_unsafe

from jobs.core.sql import enqueue as enqueue_sql
from jobs.core.states import EventType
from jobs.models import prepared

Columns = tuple[list[str], list[str], list[Any]]  # quoted columns, their casts, their values

# pre_save methods that return the attribute as it is (DateField's only acts with auto_now*).
_PLAIN_PRE_SAVE = (Field.pre_save, DateField.pre_save, DateTimeField.pre_save)


# Columns of a new job whose stored value the database decides whatever the statement sent: a
# trigger sets `deferred` from `run_at` (`jobs_job_defer`, migration 0010), and jsonb normalises
# the payload's numbers (1e300 is read back as an int, -0.0 as 0). Read back, never assumed.
READ_BACK = frozenset({"deferred", "payload"})

# Values a literal may share between the jobs built from one plan.
_IMMUTABLE = (type(None), str, int, float, bool)


@dataclass(frozen=True)
class _Lean:
    """How a keyless job is built from what was sent, the database returning only what it
    decided (the id, the columns left to their defaults, READ_BACK)."""

    attnames: list[str]  # every concrete field, in the model's order
    template: list[Any]  # per field: a literal's value (the same for every job), else None
    from_row: list[tuple[int, str]]  # (position, attname): the row's own values
    returned: list[int]  # positions of the returned columns, in RETURNING order
    converters: dict[int, Any]  # by index in `returned`: Django's converters for that column


@dataclass(frozen=True)
class _Plan:
    """One statement shape: its SQL, and the fields whose row values are its parameters."""

    sql: str
    slots: list[Field]  # in parameter order
    payload: Field  # among them, sent as the JSON text the rules checked
    lean: _Lean | None = None  # keyless: the job built from what was sent


_INSERTABLE: dict[tuple[str, type[models.Model]], list[tuple[Any, str, str]]] = {}
_EVENTS: dict[str, Columns] = {}
_READERS: dict[str, tuple[list[str], dict[int, Any]]] = {}
_PLANS: dict[tuple[Any, ...], _Plan | None] = {}
_STATEMENTS: dict[tuple[Any, ...], str] = {}
_LOCAL = threading.local()  # per thread: {alias: its connection's enqueue cursor}


def enqueue(
    job_model: type[models.Model],
    event_model: type[models.Model],
    conn: BaseDatabaseWrapper,
    row: dict[str, Any],
    unique_constraint: str,
    payload_json: str | None = None,
) -> models.Model | None:
    """Insert the job and its `enqueued` event in one statement and return the job, with
    `duplicate` set; or the live holder of its unique key (`duplicate` True); or None when the
    statement could not decide (a holder its snapshot cannot see: the caller falls back).

    `payload_json`: the payload as the JSON text the rules checked, sent as it is (else the
    payload field's own encoding)."""
    keyed = row["unique_key"] is not None
    shape = (conn.alias, job_model, tuple(row), keyed)
    if shape in _PLANS:
        plan = _PLANS[shape]
    else:
        plan = _PLANS[shape] = _plan(job_model, event_model, conn, row, unique_constraint)
    if plan is None:  # a field computed per call (a callable default, auto_now): the long way
        sql, params = _generic(job_model, event_model, conn, row, unique_constraint)
    else:
        sql, params = plan.sql, []
        for field in plan.slots:
            value = row[field.attname]
            if field is plan.payload and payload_json is not None:
                value = payload_json  # text, cast to jsonb by the statement
            elif value is not None:  # NULL is NULL for every field: no need to ask it
                value = field.get_db_prep_save(value, conn)
            params.append(value)
        if keyed:
            params.append(row["unique_key"])
    found = _execute(conn, sql, params)
    if found is None:
        return None
    if plan is not None and plan.lean is not None:
        return _built(job_model, conn, plan.lean, row, found)
    attnames, converters = _reader(job_model, conn)
    stored = list(found[:-1])
    for pos, (convert_all, expression) in converters.items():
        for convert in convert_all:
            stored[pos] = convert(stored[pos], expression, conn)
    job = job_model.from_db(conn.alias, attnames, stored)
    job.duplicate = bool(found[-1])  # type: ignore[attr-defined]
    return job


def _built(
    job_model: type[models.Model],
    conn: BaseDatabaseWrapper,
    lean: _Lean,
    row: dict[str, Any],
    found: tuple[Any, ...],
) -> models.Model:
    """The new keyless job: the literals, the row's values, and what the database returned
    (`found`, then `duplicate`)."""
    values = list(lean.template)
    for pos, attname in lean.from_row:
        values[pos] = row[attname]
    for i, pos in enumerate(lean.returned):
        value = found[i]
        if i in lean.converters:
            convert_all, expression = lean.converters[i]
            for convert in convert_all:
                value = convert(value, expression, conn)
        values[pos] = value
    job = job_model.from_db(conn.alias, lean.attnames, values)
    job.duplicate = False  # type: ignore[attr-defined]
    return job


@async_unsafe
def _execute(conn: BaseDatabaseWrapper, sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """One round trip: the statement's only row, or None."""
    wraps = conn.execute_wrappers  # but a `transparent` one's (jobs.worker.hygiene's: its SETs)
    if conn.queries_logged or (wraps and not all(getattr(w, "transparent", 0) for w in wraps)):
        with conn.cursor() as cur:  # Django must see it (a query log, a wrapper): its cursor
            cur.execute(sql, params)
            return cur.fetchone()  # type: ignore[no-any-return]
    # What conn.cursor() and its execute() check, without their wrappers' cost.
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    conn.validate_thread_sharing()
    conn.validate_no_broken_transaction()
    with conn.wrap_database_errors:
        raw = conn.connection
        own = _cursor(conn.alias, raw)
        if prepared.allowed(conn, raw):
            prepared.execute(raw, own, sql, params)
        else:
            own.execute(sql, params, prepare=False)  # type: ignore[arg-type]
        return own.fetchone()


def _cursor(alias: str, raw: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """This thread's cursor on `raw`, the connection of Django's `alias` now, kept while it is:
    a cursor's adapters learn the statement's parameter and column types on its first execute,
    and a new cursor per call looked them up again every time (~50 us of client CPU a call).
    Per thread, because a cursor's result belongs to whoever executed last; one per alias, and
    replaced when the alias reconnects -- a cursor holds its connection, so cursors kept for
    closed connections (a web process closes one per request) would keep them all."""
    cursors: dict[str, psycopg.Cursor[Any]] | None = getattr(_LOCAL, "cursors", None)
    if cursors is None:
        cursors = _LOCAL.cursors = {}
    cur = cursors.get(alias)
    if cur is None or cur.connection is not raw or cur.closed:
        cur = cursors[alias] = psycopg.Cursor(raw)
    return cur


def _plan(
    job_model: type[models.Model],
    event_model: type[models.Model],
    conn: BaseDatabaseWrapper,
    row: dict[str, Any],
    unique_constraint: str,
) -> _Plan | None:
    """The shape's statement: the row's values as parameters, every other value Django's INSERT
    would write as a literal. None when a value must be computed per call by the model (a
    callable default, auto_now: then `_generic`). Kept for the process: a row's keys are few."""
    sample = job_model(**row)
    columns: list[str] = []
    values: list[str] = []
    slots: list[Field] = []
    decided: set[str] = set(READ_BACK)  # attnames the database decides
    literals: dict[str, Any] = {}
    for field, column, sql_type in _insertable(job_model, conn):
        plain = type(field).pre_save in _PLAIN_PRE_SAVE and not (
            getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        )
        if not plain or (field.attname not in row and _callable_default(field)):
            return None
        if field.attname in row:
            slots.append(field)
            values.append(enqueue_sql.cast("%s", sql_type))
        else:
            value = field.pre_save(sample, add=True)
            if hasattr(value, "resolve_expression"):  # DatabaseDefault: the column's own default
                decided.add(field.attname)
                continue
            literals[field.attname] = value
            literal = _literal(conn, field.get_db_prep_save(value, conn))
            values.append(enqueue_sql.cast(literal, sql_type))
        columns.append(column)
    event_columns, event_casts, event_params = _event_values(event_model, conn)
    event_values = [
        enqueue_sql.cast(_literal(conn, value), sql_type)
        for value, sql_type in zip(event_params, event_casts, strict=True)
    ]
    payload = next(f for f in slots if f.attname == "payload")
    if row["unique_key"] is not None:
        holder = unique_constraint
        sql = _statement(job_model, conn, columns, values, event_columns, event_values, holder)
        return _Plan(sql, slots, payload)
    lean = _lean(job_model, conn, row, decided, literals)
    returning = None
    if lean is not None:
        fields = job_model._meta.concrete_fields
        returning = [conn.ops.quote_name(str(fields[pos].column)) for pos in lean.returned]
    sql = _statement(job_model, conn, columns, values, event_columns, event_values, None, returning)
    return _Plan(sql, slots, payload, lean)


def _lean(
    job_model: type[models.Model],
    conn: BaseDatabaseWrapper,
    row: dict[str, Any],
    decided: set[str],
    literals: dict[str, Any],
) -> _Lean | None:
    """How to build a keyless job of this shape from what is sent; None (read the whole row
    back) when a literal is a value the jobs built could share and change (a dict, a list)."""
    fields = job_model._meta.concrete_fields
    template: list[Any] = [None] * len(fields)
    from_row: list[tuple[int, str]] = []
    returned: list[int] = []
    for pos, field in enumerate(fields):
        sent = field.attname in row or field.attname in literals
        if field.attname in decided or not sent:  # READ_BACK, a default, the key, generated
            returned.append(pos)
        elif field.attname in row:
            from_row.append((pos, field.attname))
        elif not isinstance(literals[field.attname], _IMMUTABLE):
            return None
        else:
            template[pos] = literals[field.attname]
    table = job_model._meta.db_table
    compiler = Query(model=job_model).get_compiler(connection=conn)
    converters = compiler.get_converters([fields[pos].get_col(table) for pos in returned])
    attnames = [f.attname for f in fields]
    return _Lean(attnames, template, from_row, returned, converters)


def _callable_default(field: Field) -> bool:
    return field.has_default() and callable(field.default)


def _literal(conn: BaseDatabaseWrapper, value: Any) -> str:
    """`value` as an SQL literal, by the backend's own quoting; `%` doubled for the driver."""
    return str(conn.ops.compose_sql("%s", [value])).replace("%", "%%")  # type: ignore[attr-defined]


def _generic(
    job_model: type[models.Model],
    event_model: type[models.Model],
    conn: BaseDatabaseWrapper,
    row: dict[str, Any],
    unique_constraint: str,
) -> tuple[str, list[Any]]:
    """Every value from a model instance, as Django's INSERT computes it, per call."""
    columns, casts, params = insert_values(job_model(**row), conn)
    event_columns, event_casts, event_params = _event_values(event_model, conn)
    keyed = row["unique_key"] is not None
    sql = _statement(
        job_model,
        conn,
        columns,
        [enqueue_sql.cast("%s", t) for t in casts],
        event_columns,
        [enqueue_sql.cast("%s", t) for t in event_casts],
        unique_constraint if keyed else None,
    )
    return sql, [*params, *event_params] + ([row["unique_key"]] if keyed else [])


def _statement(
    job_model: type[models.Model],
    conn: BaseDatabaseWrapper,
    columns: list[str],
    values: list[str],
    event_columns: list[str],
    event_values: list[str],
    unique_constraint: str | None,
    returning: list[str] | None = None,
) -> str:
    """The statement for these columns and values; with `unique_constraint`, for a keyed job.
    It returns `returning` (quoted columns), by default the whole row."""
    shape = (
        conn.alias, tuple(columns), tuple(values), tuple(event_values), unique_constraint,
        None if returning is None else tuple(returning),
    )  # fmt: skip
    if shape not in _STATEMENTS:
        if returning is None:
            returning = [
                conn.ops.quote_name(str(f.column)) for f in job_model._meta.concrete_fields
            ]
        holder = None
        if unique_constraint is not None:
            holder = _live_holder(job_model, conn, unique_constraint)
        _STATEMENTS[shape] = enqueue_sql.enqueue_statement(
            columns, values, event_columns, event_values, returning, holder
        )
    return _STATEMENTS[shape]


def _insertable(model: type[models.Model], conn: BaseDatabaseWrapper) -> list[tuple[Any, str, str]]:
    """The fields Django's INSERT may write, with their quoted column and cast."""
    shape = (conn.alias, model)
    if shape not in _INSERTABLE:
        _INSERTABLE[shape] = [
            (f, conn.ops.quote_name(str(f.column)), str(f.cast_db_type(conn)))
            for f in model._meta.local_concrete_fields
            if not (f.primary_key or f.generated)
        ]
    return _INSERTABLE[shape]


def insert_values(obj: models.Model, conn: BaseDatabaseWrapper, skip: str = "") -> Columns:
    """What Django's INSERT of `obj` would write: columns, their types, values (db-prepared).

    A field left to its database default (db_default, no value given) is left out, as Django's own
    INSERT does; `skip` leaves out one more (an attname).
    """
    columns: list[str] = []
    casts: list[str] = []
    values: list[Any] = []
    for field, column, cast in _insertable(type(obj), conn):
        if field.attname == skip:
            continue
        value = field.pre_save(obj, add=True)
        if hasattr(value, "resolve_expression"):  # DatabaseDefault: the column's own default
            continue
        columns.append(column)
        casts.append(cast)
        values.append(field.get_db_prep_save(value, conn))
    return columns, casts, values


def _event_values(event_model: type[models.Model], conn: BaseDatabaseWrapper) -> Columns:
    """The `enqueued` event's columns and values but its job_id: the same for every job."""
    if conn.alias not in _EVENTS:
        event = event_model(attempt=0, type=EventType.ENQUEUED, data={})
        _EVENTS[conn.alias] = insert_values(event, conn, skip="job_id")
    return _EVENTS[conn.alias]


def _reader(
    job_model: type[models.Model], conn: BaseDatabaseWrapper
) -> tuple[list[str], dict[int, Any]]:
    """The job's attnames in column order and the converters Django applies when reading them."""
    if conn.alias not in _READERS:
        fields = job_model._meta.concrete_fields
        table = job_model._meta.db_table
        compiler = Query(model=job_model).get_compiler(connection=conn)
        converters = compiler.get_converters([f.get_col(table) for f in fields])
        _READERS[conn.alias] = ([f.attname for f in fields], converters)
    return _READERS[conn.alias]


def _live_holder(job_model: type[models.Model], conn: BaseDatabaseWrapper, name: str) -> str:
    """The partial unique index's own condition, as SQL: a job that holds its unique key."""
    constraint = next(c for c in job_model._meta.constraints if c.name == name)
    query = Query(model=job_model, alias_cols=False)
    where = query.build_where(constraint.condition)  # type: ignore[attr-defined]
    sql, params = where.as_sql(query.get_compiler(connection=conn), conn)
    # Inlined as literals: the states are constants of the statement, which is built once.
    return str(conn.ops.compose_sql(sql, params))  # type: ignore[attr-defined]  # PostgreSQL's
