"""Limits on what a client may send beyond its body, enforced in the HTTP protocol before
a request reaches the app.

uvicorn's httptools protocol has none of these: the parser grows a header value by
concatenation, so a 100 MB header took 12 s of the event loop (everyone else waited),
and nothing timed out a connection that sends its headers a byte at a time. Here:

- the request line and headers together are at most `max_header_bytes`, and at most
  `max_headers` headers: past either, 431 and the connection is closed. The parser is
  fed at most what is left of the budget, so it never holds more;
- a request the parser cannot read (a bad request line, Content-Length or chunk size,
  Content-Length with Transfer-Encoding) gets 400 and the connection is closed;
- they must arrive within `header_timeout` seconds of the connection opening (or of the
  request's first byte on a kept-alive connection), and the body within `body_timeout`
  seconds of the headers: past either, 408 and the connection is closed;
- at most `max_connections` connections are open at once: past it, 503 and close.

Idle kept-alive connections are closed by uvicorn's own `timeout_keep_alive`. Refusals
are in OpenAI's error shape (uvicorn's own answer to a malformed request is plain
text), logged once each and counted for /metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools
import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.schemas import ErrorBody, ErrorResponse

log = logging.getLogger("semgate.gateway")


@dataclass(frozen=True)
class ClientLimits:
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1000


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a refused request."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ClientLimits (a subclass made by
    limited_protocol() sets them)."""

    limits = ClientLimits()
    on_refusal: Callable[[str], None] = staticmethod(lambda reason: None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream protocol's transport is an asyncio.Transport (uvicorn's type says so).
        super().connection_made(cast(asyncio.Transport, transport))
        self._in_head = True  # reading a request line and headers, or waiting for one
        self._head_bytes = 0  # the current (or next) request's head, so far
        self._header_count = 0
        self._piece = 0  # bytes of the piece being parsed
        self._ended_in_piece = False  # a request ended in it
        self._timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "connections", "too many connections; retry shortly", "overloaded")
            return
        self._arm(self.limits.header_timeout, self._header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        while data and not self.transport.is_closing():
            if self._in_head:
                # Only what is left of the budget: the parser copies what it holds.
                room = self.limits.max_header_bytes - self._head_bytes
                if room <= 0:
                    self._headers_too_large(f"over {self.limits.max_header_bytes} bytes")
                    return
                piece = data[:room]
                self._head_bytes += len(piece)
            else:
                # A body, in pieces of half the budget: a pipelined request whose head
                # begins in one is charged all of it (on_message_begin).
                piece = data[: self.limits.max_header_bytes // 2]
            data = data[len(piece) :]
            self._piece, self._ended_in_piece = len(piece), False
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError as exc:
                if not self.transport.is_closing():  # else refused in a callback
                    self.send_400_response(f"invalid HTTP request: {exc}")
                return

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot read: before its head is complete, or in its body
        (a bad chunk), which the app may be waiting for: it reads a client that left."""
        # The current request's cycle: not a kept-alive connection's last, answered one.
        cycle = self.cycle if self.cycle is not None and not self.cycle.response_complete else None
        if cycle is not None and cycle.response_started:
            self.on_refusal("malformed")
            self.transport.close()
            return
        self._refuse(400, "malformed", msg, "invalid_http_request")
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # The head's bytes were counted as they were fed, from the piece it began in;
        # a request that began in a piece another ended in (pipelined) is charged all
        # of that piece, as where in it one ended and the other began is unknown.
        if self._ended_in_piece:
            self._head_bytes = self._piece
        self._in_head, self._header_count = True, 0
        if self._timer is None:  # a kept-alive connection's next request
            self._arm(self.limits.header_timeout, self._header_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._headers_too_large(f"more than {self.limits.max_headers} headers")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        self._arm(self.limits.body_timeout, self._body_timeout)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        # What follows is the next request's head.
        self._in_head, self._head_bytes, self._ended_in_piece = True, 0, True
        super().on_message_complete()

    def _headers_too_large(self, what: str) -> None:
        self._refuse(431, "header_size", f"request headers are too large ({what})",
                     "headers_too_large")  # fmt: skip

    def _header_timeout(self) -> None:
        self._timer = None
        seconds = self.limits.header_timeout
        self._refuse(408, "header_timeout", f"request headers not received within {seconds:g} s",
                     "request_timeout")  # fmt: skip

    def _body_timeout(self) -> None:
        """The body is late. If the app has answered already (say, a 401 before reading
        it) the connection just closes; else the app's wait for it ends as a client that
        left (gateway/errors.py), and the client gets a 408."""
        self._timer = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            seconds = self.limits.body_timeout
            self._refuse(408, "body_timeout", f"request body not received within {seconds:g} s",
                         "request_timeout")  # fmt: skip
            cycle.disconnected = True
            cycle.message_event.set()
        else:
            self.on_refusal("body_timeout")
            self.transport.close()

    def _arm(self, seconds: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _refuse(self, status: int, reason: str, message: str, code: str) -> None:
        """Answers `status` with an OpenAI error and closes the connection."""
        self._disarm()
        self.on_refusal(reason)
        where = f" from {self.client[0]}" if self.client else ""
        log.info("refused a request%s: %s (%d)", where, message, status)
        kind = "service_unavailable" if status == 503 else "invalid_request_error"
        body = msgspec.json.encode(ErrorResponse(ErrorBody(message, kind, None, code)))
        head: list[Any] = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ",
                 str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body]  # fmt: skip
        self.transport.write(b"".join(head))
        self.transport.close()


def limited_protocol(
    limits: ClientLimits, on_refusal: Callable[[str], None]
) -> type[LimitedHttpProtocol]:
    """The protocol class to give uvicorn (`http=`), with these limits; `on_refusal` is
    told each refusal's reason (header_size, header_timeout, body_timeout, connections,
    malformed)."""
    attributes = {"limits": limits, "on_refusal": staticmethod(on_refusal)}
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), attributes)
