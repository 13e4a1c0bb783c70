"""A pass-through's response under the model name its client asked for (an alias, or a
name the server knows its model by otherwise: llama-server answers with its GGUF file's
path): the `"model": "..."` fields of its JSON body, or of each SSE event, are
rewritten; every other byte is the upstream's."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, AsyncIterator

# A "model" key and its string value. Inside a JSON string (tool-call arguments) the key's
# quotes are escaped, so only the objects' own fields match.
_MODEL_FIELD = re.compile(rb'("model"\s*:\s*)"(?:[^"\\]|\\.)*"')


def renamed(content: bytes, model: str) -> bytes:
    name = json.dumps(model).encode()
    return _MODEL_FIELD.sub(lambda m: m.group(1) + name, content)


async def renamed_lines(chunks: AsyncIterator[bytes], model: str) -> AsyncGenerator[bytes, None]:
    """`chunks` renamed line by line (SSE sends each event's JSON on one line), each
    line whole: a chunk's unfinished line waits for the next chunk."""
    rest = b""
    async for chunk in chunks:
        lines, newline, rest = (rest + chunk).rpartition(b"\n")
        if newline:
            yield renamed(lines + newline, model)
    if rest:
        yield renamed(rest, model)
