"""What a chat answer and a text completion share on the wire: the usage and timings of
their final delta, and the end of their SSE stream."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator

import msgspec

from gateway import server_timing
from gateway.errors import APIError
from gateway.schemas import Usage
from gateway.upstream import Delta

log = logging.getLogger("semgate.gateway")


def usage_of(final: Delta | None) -> Usage:
    if final is None:
        return Usage.of(None, None, None)
    return Usage.of(final.prompt_tokens, final.completion_tokens, final.cached_tokens)


def timings_of(final: Delta | None) -> server_timing.Timings | msgspec.UnsetType:
    """The final chunk's `timings` object: absent when there are none."""
    if final is None or not final.timings:
        return msgspec.UNSET
    return server_timing.rounded(final.timings)


async def ended(
    events: AsyncIterator[str], deltas: AsyncGenerator[Delta, None]
) -> AsyncIterator[str]:
    """`events`, then [DONE]. A failure after the first event (the status line is sent)
    becomes an error event, never a silent end; the answer's deltas are closed however
    the stream ends (the client leaving included)."""
    try:
        async for event in events:
            yield event
    except APIError as exc:
        yield exc.event().decode()
    except Exception as exc:
        log.exception("stream failed")
        yield APIError(500, f"the answer failed mid-stream: {exc}", "server_error").event().decode()
    finally:
        await deltas.aclose()
    yield "[DONE]"
