"""The two log formats, shared by the gateway and the engine core's process so that one
server writes one format: `text`, one line a record, or `json`, one object a line."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# What every record has; anything else on it (an access line's fields) is kept in json.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# What could end a text line or rewrite the terminal: C0 controls but tab, DEL, C1
# controls (NEL, CSI), and Unicode's line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str) -> str:
    """`text` with its control characters written as Python escapes (\\n, \\x1b)."""
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], text)


class TextFormatter(logging.Formatter):
    """One line a record: a message (with a client's path in it, say) cannot start a
    line that passes for another record. A traceback keeps its lines, each indented."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("  " + escape_controls(line) for line in text.splitlines())


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
    return JsonFormatter() if log_format == "json" else TextFormatter(text_format)


def current_format() -> str:
    """The format this process logs in (json if the root logger's handler writes it)."""
    handlers = logging.getLogger().handlers
    return "json" if any(isinstance(h.formatter, JsonFormatter) for h in handlers) else "text"
