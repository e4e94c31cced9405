"""The row types the statements return and take, and the JSON they store.

Owns: plain data (no SQL): what a claim returns, what a commit carries (with its intents), what
a batch heartbeat presents, what the reaper decides on, and the evidence of an expiry.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from jobs.core import lanes

# The row types built once per job on the drain's path (a claim's rows, a commit's) are named
# tuples: immutable like the frozen dataclasses beside them, built in a third of the time (a
# frozen dataclass sets each field through object.__setattr__).


class ClaimedRow(NamedTuple):
    id: int
    attempt: int
    kind: str
    payload: Any  # as the database returned it: decoded by the caller, one row at a time
    max_attempts: int | None
    lease_seconds: float | None
    attempts_released: int


class JSONText(str):
    """JSON text already checked and encoded (jobs.core.bounds.json_text): `dumps` sends it as
    it is, so a handler's result is encoded once, by its check, not again by the commit."""

    __slots__ = ()


@dataclass(frozen=True)
class IntentRow:
    """An outbox intent riding on its attempt's commit (jobs/effects/outbox.py).

    `lane` (jobs.core.lanes) is named when the intent is recorded, from the data as it was then;
    a row built without one names it here, from `data` (decoded if it is JSONText)."""

    step: str
    key: str
    target: str
    data: Any
    lane: str = ""

    def __post_init__(self) -> None:
        if not self.lane:
            data = json.loads(self.data) if isinstance(self.data, JSONText) else self.data
            object.__setattr__(self, "lane", lanes.lane(self.target, data))


class CommitRow(NamedTuple):
    """One attempt's commit: the job is succeeded only if (id, attempt) is still current.

    Its intents are inserted by the same statement, only for a row that committed. `result`:
    a value, or its JSONText.
    """

    id: int
    attempt: int
    result: Any
    ref: str
    intents: tuple[IntentRow, ...] = ()


@dataclass(frozen=True)
class FenceRow:
    """(job id, attempt) plus the lease to extend it by, for batch heartbeats."""

    id: int
    attempt: int
    lease_seconds: float


@dataclass(frozen=True)
class ExpiredRow:
    """A running job whose lease ran out, with the evidence the reaper decides on."""

    id: int
    attempt: int
    kind: str
    max_attempts: int | None
    attempts_released: int
    confirmed: bool  # a heartbeat (or explicit write) confirmed its handler running
    worker: str
    # The evidence, for the reclaim's log line and event (database clock).
    lease_expires_at: Any = None
    heartbeat_at: Any = None


def _iso(value: Any) -> str | None:
    # PostgreSQL returns datetimes, SQLite the stored text.
    return value.isoformat() if hasattr(value, "isoformat") else value


def expiry_evidence(row: ExpiredRow, charged: bool, worker_exited: bool = False) -> str:
    """The expired event's data: what the reaper decided on (database clock). `worker_exited`:
    not a lease that ran out but a worker process seen dead by its cluster (a rescue)."""
    evidence = {
        "charged": charged,
        "worker": row.worker,
        "lease_expires_at": _iso(row.lease_expires_at),
        "heartbeat_at": _iso(row.heartbeat_at),
    }
    if worker_exited:
        evidence["worker_exited"] = True
    return dumps(evidence)


# json.dumps builds an encoder per call when given separators; encode() keeps no state.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def dumps(value: Any) -> str:
    if type(value) is JSONText:
        return value
    return _ENCODER.encode(value)


def commit_arrays(rows: Sequence[CommitRow]) -> dict[str, Any]:
    """A commit's rows as its statement's four arrays: transposed by zip (in C), each result
    encoded unless it is JSONText already (a handler's, checked and encoded by the runner).

    The integers travel as array literals ('{1,2,3}', cast by the statement): joined in C, where
    psycopg dumps a list of int element by element in Python (~9k instructions a job, binary).
    """
    ids, attempts, results, refs, _ = zip(*rows, strict=True) if rows else ((),) * 5
    return {
        "ids": _int_array(ids),
        "attempts": _int_array(attempts),
        "results": [r if type(r) is JSONText else dumps(r) for r in results],
        "refs": list(refs),
    }


def _int_array(values: Sequence[int]) -> str:
    return "{" + ",".join(map(str, map(int, values))) + "}"


def loads(value: Any) -> Any:
    if value == "{}":  # most payloads: a new empty dict without the decoder (1 us a job)
        return {}
    return json.loads(value) if isinstance(value, str | bytes) else value


def loads_many(values: Sequence[Any]) -> list[Any]:
    """Each value decoded as `loads` decodes it, the JSON texts in one json.loads of their array:
    json.loads' own work per call (three Python frames, two regular-expression matches) is paid
    once a batch, not once a job (a small payload: ~19k instructions a job one by one, ~7k so).
    ValueError or RecursionError if any will not decode: the caller then goes one by one."""
    try:
        joined = "[" + ",".join(values) + "]"
    except TypeError:  # not all text (a value already decoded, bytes): one by one
        return [loads(v) for v in values]
    decoded = json.loads(joined)
    if len(decoded) != len(values):  # some text was not one JSON value (a jsonb always is)
        raise ValueError("the texts are not one JSON value each")
    return decoded  # type: ignore[no-any-return]


def claimed_rows(rows: Sequence[Sequence[Any]]) -> list[ClaimedRow]:
    return [ClaimedRow(int(r[0]), int(r[1]), r[2], r[3], r[4], r[5], int(r[6])) for r in rows]


# psycopg's row maker for a claim's rows: tuple.__new__ makes each one a ClaimedRow in C, where
# claimed_rows() runs the named tuple's generated __new__ (a Python frame) and three int() a row.
_CLAIMED_ROW = partial(tuple.__new__, ClaimedRow)


def _claimed_row_maker(cursor: Any) -> Any:
    return _CLAIMED_ROW


def fetch_claimed(cur: Any) -> list[ClaimedRow]:
    """The claim's rows from a psycopg cursor (or Django's wrapper of one), each a ClaimedRow
    as psycopg loads it (PostgreSQL's integers arrive as int). The cursor's row factory is
    back as it was afterwards."""
    raw = getattr(cur, "cursor", cur)
    saved = raw.row_factory
    raw.row_factory = _claimed_row_maker
    try:
        rows: list[ClaimedRow] = raw.fetchall()
    finally:
        raw.row_factory = saved
    return rows
