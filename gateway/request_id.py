"""Every response, routed or not, carries `x-request-id`: the client's own when it sent
a sane one, else a fresh one. A `before_send` hook, because Litestar runs it for all
responses (middleware does not see requests to unknown routes)."""

from __future__ import annotations

import re
import uuid

from litestar.types import Message, Scope

_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


async def add_request_id(message: Message, scope: Scope) -> None:
    if message["type"] != "http.response.start":
        return
    given = dict(scope.get("headers", [])).get(b"x-request-id", b"")
    request_id = given if _SANE.match(given) else uuid.uuid4().hex.encode()
    message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
