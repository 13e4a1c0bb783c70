"""The two log formats, shared by the gateway and the engine core's process so that one
server writes one format: `text`, one line a record, or `json`, one object a line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# What every record has; anything else on it (an access line's fields) is kept in json.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def rfc3339(created: float) -> str:
    """A record's time as log shippers read it unambiguously: UTC, RFC 3339, to the ms."""
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= {k: v for k, v in vars(record).items() if k not in _STANDARD}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def formatter(log_format: str, text_format: str = TEXT_FORMAT) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    return JsonFormatter() if log_format == "json" else logging.Formatter(text_format)


def current_format() -> str:
    """The format this process logs in (json if the root logger's handler writes it)."""
    handlers = logging.getLogger().handlers
    return "json" if any(isinstance(h.formatter, JsonFormatter) for h in handlers) else "text"
