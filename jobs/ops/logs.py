"""Log formatting: one line per record, as text or as JSON (JOBS_LOG_FORMAT=json).

Owns: rendering. The structured lines (a rejected write, a reclaim, an operator action) pass
their fields as `extra={"fields": {...}}`; the JSON formatter puts them at the top level of the
object, so a log pipeline can filter on job_id, attempt_presented, worker, ... without parsing
the message. Never: raises, or writes a line that is not JSON -- a value that is not JSON (a
set, a dict with tuple keys, a cycle, NaN or an infinity, which json writes as the invalid
`NaN`/`Infinity`) becomes its repr, and text holding a lone surrogate (a handler's exception
message can) is written with \\u escapes, as a UTF-8 stream can carry it.
"""

import json
import logging
import math
from datetime import UTC, datetime
from typing import Any


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
            "message": record.getMessage(),
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
