"""CHECK conditions written so that PostgreSQL has nothing to rebuild for them in each write.

Owns: `OneOf`, the condition `column IN (constants)` of the state and outcome checks.

Why: PostgreSQL keeps a table's CHECK constraints as node text and, in every INSERT or UPDATE
statement, reads each one back and runs it through the planner's constant folding before the
first row (ExecRelCheck: stringToNode + expression_planner, per statement, not cached between
them). Django's `Q(state__in=[...])` on a varchar column is stored as
`(state)::text = ANY ((ARRAY['queued'::character varying, ...])::text[])`: an array expression
that each statement folds into a constant again, element by element, then coerces to text[] --
on jobs_job, three such arrays in every claim, commit and enqueue. `OneOf` stores the constant
itself, `(state)::text = ANY ('{queued,...}'::text[])`: nothing left to fold, and a shorter text
to read. The rows it admits are the same.

Never: values other than plain identifiers (`[a-z0-9_]`): the array literal is written into the
SQL text, not bound -- a CHECK constraint's DDL has no parameters.
"""

import re
from collections.abc import Iterable
from typing import Any

from django.db.models import Lookup

_PLAIN = re.compile(r"[a-z0-9_]+")


class OneOf(Lookup):
    """`OneOf(F("state"), ["queued", "running"])`: the column holds one of the constants.

    PostgreSQL: `(state)::text = ANY ('{queued,running}'::text[])`; other databases (SQLite in
    the fast suite): `state IN ('queued', 'running')`. A condition for CheckConstraint (and a
    filter, like any lookup); Django's model validation evaluates it with the instance's values.
    """

    lookup_name = "one_of"
    prepare_rhs = False

    def __init__(self, lhs: Any, rhs: Iterable[str]) -> None:
        values = tuple(str(v) for v in rhs)
        if not values:
            raise ValueError("OneOf needs at least one value")
        for value in values:
            if not _PLAIN.fullmatch(value):
                raise ValueError(f"OneOf takes plain identifiers only, not {value!r}")
        super().__init__(lhs, values)

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, params = self.process_lhs(compiler, connection)
        placeholders = ", ".join(["%s"] * len(self.rhs))
        return f"{lhs} IN ({placeholders})", (*params, *self.rhs)

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        lhs, params = self.process_lhs(compiler, connection)
        array = "{" + ",".join(self.rhs) + "}"
        return f"({lhs})::text = ANY ('{array}'::text[])", tuple(params)
