"""Every request has one id: the client's own `x-request-id` when it sent a sane one, else
a fresh one. Every response carries it, through a `before_send` hook (Litestar runs it for
all responses; middleware does not see requests to unknown routes), and remote servers
are sent it, so that their logs, the gateway's and the client's name the request alike."""

from __future__ import annotations

import re
import uuid

from litestar.types import Message, Scope

_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
_KEY = "semgate_request_id"  # in the scope's state: chosen once, on first ask


def request_id(scope: Scope) -> str:
    state = scope.setdefault("state", {})
    if (found := state.get(_KEY)) is None:
        given = dict(scope.get("headers", [])).get(b"x-request-id", b"")
        found = given.decode() if _SANE.match(given) else uuid.uuid4().hex
        state[_KEY] = found
    return found


async def add_request_id(message: Message, scope: Scope) -> None:
    if message["type"] != "http.response.start":
        return
    header = (b"x-request-id", request_id(scope).encode())
    message["headers"] = [*message.get("headers", []), header]
