"""Log formatting: one line per record, as text or as JSON (JOBS_LOG_FORMAT=json).

Owns: rendering, and the rule that makes data printable on one line (`printable`, which `manage.py
jobs` prints rows with too). The structured lines (a rejected write, a reclaim, an operator
action) pass their fields as `extra={"fields": {...}}`; the JSON formatter puts them at the top
level of the object, so a log pipeline can filter on job_id, attempt_presented, worker, ...
without parsing the message. Never: raises, or writes a line that is not JSON -- a value that is
not JSON (a set, a dict with tuple keys, a cycle, NaN or an infinity, which json writes as the
invalid `NaN`/`Infinity`) becomes its repr, and text holding a lone surrogate (a handler's
exception message can) is written with \\u escapes, as a UTF-8 stream can carry it.

Hazard, the text format (the default, `bin/run`'s console): a message carries data -- a peer's
error text (an outbox target's exception), the keys of an application's rows in a refused token
write, a kind or worker read from a row. Written as it is, a newline in it would end the line
(the rest read as a line of its own, which it can forge) and an ESC or CSI sequence would act on
the operator's terminal. So `LineFormatter` writes every C0 and C1 control character of a
message as \\xNN; a traceback (or stack) appended after it keeps its line breaks, nothing else,
and each of its lines is indented: an exception's message is a peer's text too, and only a
record begins at the first column. A message whose args do not fit it is written as it is held
(its format's repr and the args'), in both formats, never lost to "--- Logging error ---".
"""

import json
import logging
import math
import re
from datetime import UTC, datetime
from typing import Any

# C0 and C1 control characters; in a traceback, all but its newlines.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def printable(line: str) -> str:
    """One line as text a terminal shows rather than obeys: control characters as \\xNN."""
    return _CONTROL.sub(_escaped, line)


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
    """A traceback's or stack's lines, each indented under its record, controls but \\n as \\xNN."""
    return "  " + _CONTROL_BUT_NEWLINE.sub(_escaped, text).replace("\n", "\n  ")


class LineFormatter(logging.Formatter):
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


class JsonFormatter(logging.Formatter):
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
        return text
