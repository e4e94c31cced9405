"""Log formatting: one line per record, as text or as JSON (JOBS_LOG_FORMAT=json).

Owns: rendering. The structured lines (a rejected write, a reclaim, an operator action) pass
their fields as `extra={"fields": {...}}`; the JSON formatter puts them at the top level of the
object, so a log pipeline can filter on job_id, attempt_presented, worker, ... without parsing
the message. Never: raises -- a value that is not JSON becomes its repr.
"""

import json
import logging
from datetime import UTC, datetime
from typing import Any


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
        return json.dumps(line, default=repr, ensure_ascii=False)
