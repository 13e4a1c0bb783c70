"""Incremental detokenization and stop strings."""

from __future__ import annotations

from engine.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Byte-level BPE can split one character across tokens, so a token's text is
    only final once decoding it with its neighbours no longer ends in U+FFFD.
    Decoding a short window (prefix_offset..end) instead of the whole output
    keeps each step O(1).
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        # Held back while streaming: the tail that could still become a stop string.
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""
        self.emitted = 0  # characters of text already handed out

    def add(self, token_id: int) -> str | None:
        """Appends a token; returns the stop string it completed, if any."""
        self.token_ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = decode(self.token_ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        delta = full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        search_from = max(0, len(self.text) - self.holdback)
        self.text += delta
        hits = [(at, s) for s in self.stop if (at := self.text.find(s, search_from)) != -1]
        if not hits:
            return None
        at, stop = min(hits)
        self.text = self.text[:at]
        return stop

    def take_delta(self, finished: bool) -> str:
        """New text since the last call; keeps back a possible stop-string start."""
        end = len(self.text) if finished else max(self.emitted, len(self.text) - self.holdback)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
