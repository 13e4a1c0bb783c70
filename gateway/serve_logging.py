"""One logging setup for `semgate serve`, and its access log.

Every logger (ours, uvicorn's, Litestar's, the libraries') writes through one
handler on stderr in one format: `text`, one line a record that never wraps, or
`json`, one object a line (time, level, logger, message, and the request's fields
on access lines), for log shippers. `AccessLog` wraps the whole ASGI app, so it
sees every request, routed or not, and writes one line when its response has
been sent: method, path, status, cache status, duration, request id and tenant
(never a key). 4xx and 5xx are logged like any other answer, at info; server
errors also log their own traceback where they happen.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from engine.logs import formatter

QUIET_LOGGERS = ("httpx", "sentence_transformers", "uvicorn.access")
# Probes answer every few seconds: their access lines are kept at debug.
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})

access_log = logging.getLogger("semgate.access")


def configure_logging(log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # library warnings in the same format, not raw stderr
    for name in ("uvicorn", "uvicorn.error", "litestar"):  # theirs, through ours
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class AccessLog:
    """The ASGI app, with one access line for each HTTP request once it is answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        response: dict[str, Any] = {"status": 500, "headers": {}}

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                response["headers"] = dict(message.get("headers", []))
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            headers = response["headers"]
            fields = {
                "method": scope.get("method", ""),
                "path": scope.get("path", ""),
                "status": response["status"],
                "cache_status": headers.get(b"x-cache-status", b"-").decode(),
                "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                "request_id": headers.get(b"x-request-id", b"-").decode(),
                "tenant": scope.get("state", {}).get("tenant", "-"),
            }
            level = logging.DEBUG if fields["path"] in PROBE_PATHS else logging.INFO
            access_log.log(
                level,
                '"%s %s" %s cache=%s %.1f ms id=%s tenant=%s',
                *fields.values(),
                extra=fields,
            )
