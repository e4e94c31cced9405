"""Log formatting: one line per record, as text or as JSON (JOBS_LOG_FORMAT=json).

Owns: rendering, and the rule that makes data printable on one line (`printable`, which `manage.py
jobs` prints rows with too). The structured lines (a rejected write, a reclaim, an operator
action) pass their fields as `extra={"fields": {...}}`; the JSON formatter puts them at the top
level of the object, so a log pipeline can filter on job_id, attempt_presented, worker, ...
without parsing the message. Never: raises, or writes a line that is not JSON -- a value that is
not JSON (a set, a dict with tuple keys, a cycle, NaN or an infinity, which json writes as the
invalid `NaN`/`Infinity`) becomes its repr, and text holding a lone surrogate (a handler's
exception message can) is written with \\u escapes, as a UTF-8 stream can carry it; so are the
characters a viewer (or str.splitlines) breaks a line at or reorders it by (C1, U+2028, U+2029,
the bidi controls below): the same JSON, on one line.

Hazard, the text format (the default, `bin/run`'s console): a message carries data -- a peer's
error text (an outbox target's exception), the keys of an application's rows in a refused token
write, a kind or worker read from a row. Written as it is, a newline in it would end the line
(the rest read as a line of its own, which it can forge) and an ESC or CSI sequence would act on
the operator's terminal; a line separator (U+2028, U+2029) would end the line in many a log
viewer, and a bidi override or isolate (U+202A-U+202E, U+2066-U+2069) would show the rest of it
reordered. So `LineFormatter` writes every C0 and C1 control character of a message as \\xNN,
and those as \\uNNNN; a traceback (or stack) appended after it keeps its line breaks, nothing else,
and each of its lines is indented: an exception's message is a peer's text too, and only a
record begins at the first column. A message whose args do not fit it is written as it is held
(its format's repr and the args'), in both formats, never lost to "--- Logging error ---"; nor is
a traceback whose exception's own code raises while it is formatted (`bounds.exception_text`).
"""

import json
import logging
import math
import re
from datetime import UTC, datetime
from typing import Any

from jobs.core import bounds

# What a line must not carry as it is: the C0 and C1 control characters (NEL, U+0085, is C1),
# written as \xNN; the line and paragraph separators U+2028/U+2029 (str.splitlines and many log
# viewers break a line there: the rest could pass for a record) and the bidirectional embeddings,
# overrides and isolates U+202A-U+202E, U+2066-U+2069 (they reorder how a viewer shows the rest
# of the line: "Trojan Source"), written as \uNNNN. The marks LRM, RLM and ALM are left as they
# are: they move no strong text, and right-to-left text carries them.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    c: f"\\u{c:04x}" for c in (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
}
_UNSAFE = re.compile("[" + "".join(f"\\u{c:04x}" for c in _ESCAPES) + "]")
_BUT_NEWLINE = {c: text for c, text in _ESCAPES.items() if c != 0x0A}  # in a traceback
# In a JSON line (json escapes C0 itself; these it writes as they are): the same JSON, escaped.
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _ESCAPES if c >= 0x7F}
# How: a search first (most lines hold none of them), then one str.replace per character the
# line holds -- each a pass in C -- or, past REPLACES distinct ones, one str.translate. Before, a
# regex sub called a Python function per character: a message of 2,000,000 ESCs took 1.7 s (6.1 s
# on a loaded machine, 0.06 s now there). translate alone is no better bound: it looks each
# character up, and one it leaves (a miss) raises inside it, so 2,000,000 CJK characters and one
# ESC took ~1 s; passes cost most with many distinct characters (75: ~1 s, translate ~0.4 s).
REPLACES = 16


def _escaped(text: str, table: dict[int, str]) -> str:
    if _UNSAFE.search(text) is None:
        return text
    held = [c for c in table if chr(c) in text]
    if len(held) > REPLACES:
        return text.translate(table)
    for c in held:  # the escapes are printable ASCII: no later pass finds one of its own
        text = text.replace(chr(c), table[c])
    return text


def printable(line: str) -> str:
    """One line as text a terminal shows rather than obeys, and a viewer shows as one line in
    its order: control characters as \\xNN, line separators and bidi controls as \\uNNNN."""
    return _escaped(line, _ESCAPES)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001  an application's object: whatever its repr raises
        return f"<{type(value).__name__}: repr failed>"


def message(record: logging.LogRecord) -> str:
    """The record's message; where its args do not fit it (or its text raises), what it holds."""
    try:
        return record.getMessage()
    except Exception as exc:  # noqa: BLE001  a caller's format and args: whatever they raise
        held = f"{_repr(record.msg)} % {_repr(record.args)}"
        return f"{held} (not formatted: {type(exc).__name__})"


def _indented(text: str) -> str:
    """A traceback's or stack's lines, each indented under its record, all else `printable`
    escapes escaped (controls but \\n as \\xNN)."""
    return "  " + _escaped(text, _BUT_NEWLINE).replace("\n", "\n  ")


class _Formatter(logging.Formatter):
    def formatException(self, ei: Any) -> str:
        """The traceback as logging writes it; where the exception's own code raises while it is
        formatted (a `__getattr__` raising KeyError for `__notes__`: an application's error, a
        hook's, a peer's), as `bounds.exception_text` writes it. Before, the record was lost to
        "--- Logging error ---" on stderr."""
        try:
            return super().formatException(ei)
        except Exception:  # noqa: BLE001  the exception's own code
            exc = ei[1] if isinstance(ei, tuple) and len(ei) == 3 else ei
            if not isinstance(exc, BaseException):
                return f"(an exception that could not be formatted: {type(exc).__name__})"
            return bounds.exception_text(exc).removesuffix("\n")


class LineFormatter(_Formatter):
    """The text console's format: each record one line, its message's control characters
    escaped (a traceback appended after it keeps its line breaks, nothing else, each of its
    lines indented)."""

    def format(self, record: logging.LogRecord) -> str:
        # A copy: its message formatted once, here, and its traceback too -- never the exc_text
        # another handler left on the record, unescaped.
        record = logging.makeLogRecord(record.__dict__)
        record.msg, record.args, record.exc_text = message(record), None, None
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _plain(value: Any) -> Any:
    """`value` if JSON holds it as it is, else its repr."""
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    try:
        return json.loads(json.dumps(value, default=repr, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


class JsonFormatter(_Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message(record),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                line.setdefault(str(key), value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        try:
            text = json.dumps(line, default=repr, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            line = {key: _plain(value) for key, value in line.items()}
            text = json.dumps(line, ensure_ascii=False)
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate: escaped, still the same JSON
            text = json.dumps(json.loads(text))
        return _escaped(text, _JSON_ESCAPES)
