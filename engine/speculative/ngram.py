"""N-gram prompt lookup: propose what followed the latest earlier occurrence of the
sequence's last n tokens, in its own prompt and output. No model, no tensors."""

from __future__ import annotations


class NgramIndex:
    """For one sequence and each n, the latest end of every n-gram seen so far.

    Built incrementally: each token is indexed once, so a lookup costs O(max_n)
    however long the sequence grows. An n-gram ending at e (tokens[e-n:e]) is
    indexed only once e < len(tokens), so the sequence's own suffix never
    matches itself and a match always has at least one token after it.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.latest: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in `latest`

    def propose(self, tokens: list[int], k: int) -> list[int]:
        end = len(tokens)
        for e in range(max(self.indexed, self.min_n), end):
            for n in range(self.min_n, min(self.max_n, e) + 1):
                self.latest[tuple(tokens[e - n : e])] = e
        self.indexed = max(self.indexed, end)
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            start = self.latest.get(tuple(tokens[end - n :]))
            if start is not None:
                return tokens[start : start + k]
        return []


class NgramProposer:
    """One NgramIndex per running sequence."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.indexes: dict[str, NgramIndex] = {}

    def propose(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        index = self.indexes.get(request_id)
        if index is None:
            index = self.indexes[request_id] = NgramIndex(self.min_n, self.max_n)
        return index.propose(tokens, k)

    def release(self, request_id: str) -> None:
        self.indexes.pop(request_id, None)
