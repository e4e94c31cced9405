"""The limits on every value that comes from a user, a handler or the environment.

Owns: ranges (lease, attempts, priority, run_at, retry settings), JSON that the database can
store as given (no NUL, no lone surrogate, bounded depth and size, no two keys of one object that
are one JSON key -- 1 and "1" -- of which jsonb would keep the last) and error text made storable (a
handler's exception formatted whatever its own code raises). Never: touches the database. The
ranges that must also hold for rows inserted without enqueue (raw SQL, bulk_create) are
mirrored by CHECK constraints in jobs/models.py; tests keep both in step.

Why: a value PostgreSQL refuses (a string holding NUL, an interval that overflows) does not fail
alone -- it fails the statement, and a statement may carry a batch of jobs or pick the next job for
every drain. So a bad value is refused where it enters, with a clear ValueError subclass.
"""

import json
import math
import re
import traceback
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from jobs.core.exceptions import InvalidOption, InvalidPayload, PayloadTooLarge

LEASE_SECONDS = (0.5, 7 * 24 * 3600.0)
MAX_ATTEMPTS = (1, 1000)
PRIORITY = (-32768, 32767)  # smallint
RUN_AT_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
RUN_AT_HORIZON = timedelta(days=3660)  # about ten years ahead
RETRY_SECONDS = (0.0, 30 * 24 * 3600.0)
JSON_DEPTH = 64
ERROR_CHARS = 10_000
TEXT_CHARS = 200  # unique_key
KIND_CHARS = 100  # Job.kind is varchar(100)
# A queue name, as enqueue (jobs.core.enqueue.QUEUE_NAME), the settings and the task backend check
# it. \Z: "$" would allow a final "\n".
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")

# json.dumps escapes NUL as \u0000 (PostgreSQL's jsonb refuses it); an escaped backslash
# before it ("\\u0000" in the text) is a literal backslash, not NUL, hence the even-run prefix.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# PostgreSQL keeps a JSON number as `numeric` and writes it back in plain notation: the 6
# characters of 1e+308 come back as 309, those of 5e-324 as 326. Python writes a float with an
# exponent as <digit>e<sign><digit>; strings are matched whole so that text in them is skipped.
_EXPONENT = re.compile(r"[0-9]e[-+][0-9]")
_STRING_OR_EXPONENT = re.compile(r'"(?:[^"\\]++|\\.)*+"|-?[0-9]+(?:\.[0-9]+)?e[-+][0-9]+')
# A JSON number is PostgreSQL's `numeric`, which holds at most 131,072 digits before the decimal
# point: a longer integer fails the whole statement (a DataError, which aborts the caller's
# transaction). Python writes no int longer than 4,300 digits unless that limit is lifted
# (PYTHONINTMAXSTRDIGITS=0, sys.set_int_max_str_digits(0)); then it is refused here.
NUMERIC_DIGITS = 131_072
# Strings are matched whole (text in them is skipped); a run of digits only from its first digit,
# so that a long run is read once, not once per digit.
_STRING_OR_LONG_INTEGER = re.compile(
    r'"(?:[^"\\]++|\\.)*+"|(?<![0-9])[0-9]{' + str(NUMERIC_DIGITS + 1) + ",}"
)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number_in(name: str, value: object, bounds: tuple[float, float], *, integer: bool) -> None:
    """Raise InvalidOption unless `value` is a finite number (an int if `integer`) in bounds."""
    low, high = bounds
    kind = "an int" if integer else "a number"
    if not _is_number(value) or (integer and not isinstance(value, int)):
        raise InvalidOption(f"{name} must be {kind}, not {type(value).__name__}")
    finite = isinstance(value, int) or math.isfinite(value)  # type: ignore[arg-type]
    if not finite or not low <= value <= high:  # type: ignore[operator]
        raise InvalidOption(f"{name} = {value!r} is outside [{low:g}, {high:g}]")


def lease_seconds(value: object, name: str = "lease_seconds") -> None:
    number_in(name, value, LEASE_SECONDS, integer=False)


def max_attempts(value: object, name: str = "max_attempts") -> None:
    number_in(name, value, MAX_ATTEMPTS, integer=True)


def priority(value: object) -> None:
    number_in("priority", value, PRIORITY, integer=True)


def run_at(value: object) -> None:
    if not isinstance(value, datetime) or timezone.is_naive(value):
        raise InvalidOption("run_at must be a timezone-aware datetime")
    latest = timezone.now() + RUN_AT_HORIZON
    if not RUN_AT_EARLIEST <= value <= latest:
        raise InvalidOption(f"run_at {value.isoformat()} is outside [2000-01-01, now + 10 years]")


def storable_text(name: str, value: str, limit: int) -> None:
    """A short string the database can store as text: no NUL, no lone surrogate, bounded."""
    if not 0 < len(value) <= limit:
        raise InvalidOption(f"{name} must be a non-empty string of at most {limit} characters")
    if "\x00" in value:
        raise InvalidOption(f"{name} must not contain NUL")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidOption(f"{name} must not contain lone surrogates") from None


def kind(value: object) -> None:
    """A job kind the database could store: a string of 1..KIND_CHARS storable characters. Checked
    before the kind is looked up, so a lookup (and a resolver's import) sees only such strings."""
    if not isinstance(value, str):
        raise InvalidOption(f"kind must be a string, not {type(value).__name__}")
    storable_text("kind", value, KIND_CHARS)


_PLAIN = (dict, list, tuple)


def _as_encoded(value: Any, limit: int, what: str) -> Any:
    """`value` checked for depth, as json's encoder will read it.

    Plain dicts, lists and tuples are walked as they are stored (iteratively: a hostile depth, or
    a cycle, cannot exhaust the interpreter's stack) and the value itself is returned. The
    encoder reads a subclass through its own methods -- a dict's items(), a list's or tuple's
    __iter__ -- which may answer differently on each call (a values() that hides its content
    hid 500 levels from the walk here, stored past the limit). So where a subclass appears, the
    value is copied into plain containers instead, each subclass read once, the way the encoder
    reads it; the copy is what is checked and then encoded.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if type(item) not in _PLAIN:
            return _plain_copy(value, 1, limit, what)
        if depth > limit:
            raise InvalidPayload(f"{what} is nested deeper than {limit} levels")
        if type(item) is dict:
            if not _STR_ONLY.issuperset(map(type, item)):
                _distinct_keys(dict.keys(item), what)
            children = dict.values(item)
        else:
            children = item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list | tuple))
    return value


def _plain_copy(value: Any, depth: int, limit: int, what: str) -> Any:
    # Recursive, but never deeper than `limit` calls: past it the value is refused.
    if not isinstance(value, dict | list | tuple):
        return value
    if depth > limit:
        raise InvalidPayload(f"{what} is nested deeper than {limit} levels")
    if isinstance(value, dict):
        items = dict.items(value) if type(value) is dict else value.items()
        copy = {k: _plain_copy(v, depth + 1, limit, what) for k, v in items}
        _distinct_keys(copy, what)
        return copy
    return [_plain_copy(v, depth + 1, limit, what) for v in value]


_STR_ONLY = frozenset([str])


def json_key(key: Any) -> Any:
    """A dict key as json's encoder writes it: a str as it is, a float or int as its repr, True,
    False and None as true, false and null. Any other key (and NaN, infinity) is returned as it
    is, colliding with none: the encoder refuses it."""
    if isinstance(key, str):
        return str.__str__(key)
    if key is True or key is False or key is None:
        return "true" if key else ("false" if key is False else "null")
    if isinstance(key, float):
        return float.__repr__(key) if math.isfinite(key) else key
    if isinstance(key, int):
        return int.__repr__(key)  # past Python's digit limit: ValueError, as the encoder's
    return key


def _distinct_keys(keys: Any, what: str) -> None:
    """Refuse a dict two of whose keys the encoder writes as one JSON key (1 and "1", True and
    "true", 1.5 and "1.5"): the stored object would keep only the last one's value."""
    seen: dict[Any, Any] = {}
    for key in keys:
        text = json_key(key)
        if text in seen:
            raise same_key(seen[text], key, text, what)
        seen[text] = key


def same_key(first: Any, second: Any, text: Any, what: str) -> InvalidPayload:
    """The error for two keys of one object that are one key (`text`) once stored as JSON."""
    return InvalidPayload(
        f"{what} has the keys {first!r:.80} and {second!r:.80}, which are the same key once "
        f"stored as JSON ({text!r:.80}): only one value would be kept"
    )


def json_value(value: Any, limit_bytes: int, what: str = "payload") -> int:
    """Refuse what is not plain JSON the database can store; return its encoded size in bytes.

    Refused: non-JSON types, NaN/Infinity, nesting deeper than JSON_DEPTH, strings holding NUL or
    lone surrogates (PostgreSQL's jsonb stores neither), integers longer than `numeric` holds,
    and more than `limit_bytes` of UTF-8 -- a number counted as the database writes it back, in
    plain notation (1e+308: 309 bytes).
    """
    if value is None or isinstance(value, bool):
        return 5  # the common result of a no-op ("null", "true", "false"): nothing to inspect
    return _checked_json(value, limit_bytes, what)[1]


def json_text(value: Any, limit_bytes: int, what: str = "payload") -> str:
    """`json_value`'s checks, returning the JSON text itself: what the database is then sent,
    so a value is encoded once (enqueue passes it to the `jsonb` column as it is, the runner a
    handler's result to its commit)."""
    if value is None:
        return "null"  # a no-op's result: nothing to inspect
    if value is True or value is False:
        return "true" if value else "false"
    return _checked_json(value, limit_bytes, what)[0]


# json.dumps builds an encoder per call when given options; encode() keeps no state.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _checked_json(value: Any, limit_bytes: int, what: str) -> tuple[str, int]:
    """The checks, on the JSON text the caller is to send (so the value is read once: a value
    that answers differently on a second reading cannot pass one check and store another).

    Errors the value's own code raises while it is read (a subclass's items() or __iter__: a
    RuntimeError, a RecursionError) propagate as they are; the runner turns them into that
    job's failure."""
    try:
        if isinstance(value, dict | list | tuple):
            value = _as_encoded(value, JSON_DEPTH, what)
        encoded = _ENCODER.encode(value)
    except InvalidPayload:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON-serialisable: {exc}") from None
    try:
        size = len(encoded.encode())
    except UnicodeEncodeError:
        raise InvalidPayload(
            f"{what} holds a lone surrogate, which JSON text cannot store"
        ) from None
    if _EXPONENT.search(encoded):  # numbers the database writes back longer (1e+308)
        size += _plain_growth(encoded)
    if size > limit_bytes:
        raise PayloadTooLarge(f"{what} is {size} bytes encoded; the limit is {limit_bytes}")
    if "\\u0000" in encoded and _ESCAPED_NUL.search(encoded):
        raise InvalidPayload(f"{what} holds a NUL character, which the database cannot store")
    if len(encoded) > NUMERIC_DIGITS and _has_long_integer(encoded):
        raise InvalidPayload(
            f"{what} holds an integer of more than {NUMERIC_DIGITS} digits, "
            "which the database cannot store"
        )
    return encoded, size


def _has_long_integer(encoded: str) -> bool:
    """Whether a number of `encoded` (strings skipped) has more digits than `numeric` holds."""
    return any(m.group()[0] != '"' for m in _STRING_OR_LONG_INTEGER.finditer(encoded))


def _plain_growth(encoded: str) -> int:
    """How many bytes longer the database's text of `encoded` is: each number written with an
    exponent comes back in plain notation (as Decimal's "f" format writes it, digit for digit)."""
    growth = 0
    for match in _STRING_OR_EXPONENT.finditer(encoded):
        token = match.group()
        if token[0] != '"':
            growth += len(format(Decimal(token), "f")) - len(token)
    return growth


def storable_error(text: str) -> str:
    """Error text as the database can store it: NUL and lone surrogates escaped, tail kept."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text[-ERROR_CHARS:]


def exception_text(exc: BaseException) -> str:
    """`exc`'s traceback as Python formats it (its chain, its notes), never raising.

    Formatting runs the exception's own code: a `__notes__` that raises when read, or a
    `__getattr__` that raises something other than AttributeError for a name it lacks (an API
    error whose fields live in a dict: KeyError), makes `traceback.format_exception` raise. Then
    its frames and its class are written as Python writes them, after a line saying why, so the
    failure is still its own job's, its class on the last line."""
    try:
        return "".join(traceback.format_exception(exc))
    except Exception as failed:  # noqa: BLE001  the exception's own code raised
        why = " ".join(filter(None, [type(failed).__name__ + ":", _first_line(failed)]))
    try:
        frames = "".join(traceback.format_tb(exc.__traceback__))
    except Exception:  # noqa: BLE001
        frames = ""
    return (
        f"(its traceback could not be formatted in full: {why.rstrip(':')})\n"
        f"Traceback (most recent call last):\n{frames}{_bare_line(exc)}\n"
    )


def exception_line(exc: BaseException) -> str:
    """`exc` as the end of its traceback, `module.Class: message` (and its notes), as
    `traceback.format_exception_only` writes it, never raising: where its own code raises
    (`exception_text`'s cases), its class and the first line of its message."""
    try:
        return "".join(traceback.format_exception_only(exc)).strip()
    except Exception:  # noqa: BLE001  the exception's own code raised
        return _bare_line(exc)


def _bare_line(exc: BaseException) -> str:
    """`module.Qualname: first line` (bare `Qualname` for builtins), as Python names a class."""
    cls = type(exc)
    name, module = cls.__qualname__, getattr(cls, "__module__", None)
    if not isinstance(module, str):
        module = "<unknown>"  # as traceback writes a class whose __module__ is not text
    if module != "builtins":
        name = f"{module}.{name}"
    message = _first_line(exc)
    return f"{name}{': ' if message else ''}{message}"


def _first_line(exc: BaseException) -> str:
    """The first line of `str(exc)` (its own __str__ may raise: then nothing)."""
    try:
        return (str(exc)[:200].splitlines() or [""])[0]
    except Exception:  # noqa: BLE001
        return ""
