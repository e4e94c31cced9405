"""PostgreSQL's one-statement enqueue, seen from the records: the row in, a real `Job` out.

Owns: turning an enqueue's row (jobs/core/enqueue.py `fields`, the one place of the rules) into
the columns, types and values Django's own INSERT would write -- taken from the model's fields, so
a column added later with a default needs nothing here -- and the statement's result back into a
model instance with Django's converters. The SQL text is jobs/core/sql/enqueue.py's.

Never: validates, commits or opens a transaction (`Job.objects.enqueue()` is the caller, inside
the caller's transaction); never used on SQLite, which keeps the savepoint path.

Everything derived from the model (columns, casts, converters, the live-holder condition) is
computed once per connection alias and kept: an enqueue is on the hot path of applications.
"""

from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql import Query

from jobs.core.sql import enqueue as enqueue_sql
from jobs.core.states import EventType

Columns = tuple[list[str], list[str], list[Any]]  # quoted columns, their casts, their values

_INSERTABLE: dict[tuple[str, type[models.Model]], list[tuple[Any, str, str]]] = {}
_EVENTS: dict[str, Columns] = {}
_READERS: dict[str, tuple[list[str], dict[int, Any]]] = {}
_STATEMENTS: dict[tuple[Any, ...], str] = {}


def enqueue(
    job_model: type[models.Model],
    event_model: type[models.Model],
    conn: BaseDatabaseWrapper,
    row: dict[str, Any],
    unique_constraint: str,
) -> models.Model | None:
    """Insert the job and its `enqueued` event in one statement and return the job, with
    `duplicate` set; or the live holder of its unique key (`duplicate` True); or None when the
    statement could not decide (a holder its snapshot cannot see: the caller falls back)."""
    columns, casts, values = insert_values(job_model(**row), conn)
    event_columns, event_casts, event_values = _event_values(event_model, conn)
    unique_key = row["unique_key"]
    shape = (conn.alias, tuple(columns), unique_key is not None)
    if shape not in _STATEMENTS:
        returning = [conn.ops.quote_name(str(f.column)) for f in job_model._meta.concrete_fields]
        holder = None
        if unique_key is not None:
            holder = _live_holder(job_model, conn, unique_constraint)
        _STATEMENTS[shape] = enqueue_sql.enqueue_statement(
            columns, casts, event_columns, event_casts, returning, holder
        )
    params = [*values, *event_values] + ([unique_key] if unique_key is not None else [])
    with conn.cursor() as cur:
        cur.execute(_STATEMENTS[shape], params)
        found = cur.fetchone()
    if found is None:
        return None
    attnames, converters = _reader(job_model, conn)
    stored = list(found[:-1])
    for pos, (convert_all, expression) in converters.items():
        for convert in convert_all:
            stored[pos] = convert(stored[pos], expression, conn)
    job = job_model.from_db(conn.alias, attnames, stored)
    job.duplicate = bool(found[-1])  # type: ignore[attr-defined]
    return job


def insert_values(obj: models.Model, conn: BaseDatabaseWrapper, skip: str = "") -> Columns:
    """What Django's INSERT of `obj` would write: columns, their types, values (db-prepared).

    A field left to its database default (db_default, no value given) is left out, as Django's own
    INSERT does; `skip` leaves out one more (an attname).
    """
    shape = (conn.alias, type(obj))
    if shape not in _INSERTABLE:
        _INSERTABLE[shape] = [
            (f, conn.ops.quote_name(str(f.column)), str(f.cast_db_type(conn)))
            for f in obj._meta.local_concrete_fields
            if not (f.primary_key or f.generated)
        ]
    columns: list[str] = []
    casts: list[str] = []
    values: list[Any] = []
    for field, column, cast in _INSERTABLE[shape]:
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
