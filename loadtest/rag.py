"""The rag workload: long prompts built of real ShareGPT answers as passages, followed by a
question that wants a short answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from loadtest.work_item import WorkItem, WorkloadOptions

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

QUESTIONS = (
    "What is the main topic of these passages?",
    "Summarize the first passage in one sentence.",
    "Which passage is the most technical, and why?",
    "List three keywords that describe the passages.",
    "What question was the last passage most likely answering?",
    "Name one concrete recommendation made in the passages.",
    "Which passage would a beginner find hardest to follow?",
    "What tone do the passages have?",
)
ANSWER_TOKENS = (16, 64)  # range of answer lengths, capped by max_output_tokens
_PASSAGE_TOKENS = (64, 1024)  # answers outside this range make poor passages
_INSTRUCTION = "Read the passages below, then answer the question after them briefly.\n\n"


def _passages(tokenizer: Tokenizer) -> Iterator[list[int]]:
    """Token ids of ShareGPT answers, in file order."""
    from bench.sharegpt import first_exchanges

    lo, hi = _PASSAGE_TOKENS
    for _, answer in first_exchanges():
        ids = tokenizer.encode(answer.strip())
        if lo <= len(ids) <= hi:
            yield ids


def _context(tokenizer: Tokenizer, passages: Iterator[list[int]], budget: int) -> str:
    """Numbered passages that fill `budget` tokens; the last one is cut to fit."""
    parts: list[str] = []
    used = 0
    while used < budget:
        header = f"[Passage {len(parts) + 1}]\n"
        room = budget - used - len(tokenizer.encode(header))
        if room <= 0:
            break
        ids = next(passages)[:room]
        parts.append(header + tokenizer.decode(ids) + "\n\n")
        used += len(tokenizer.encode(parts[-1]))
    return "".join(parts)


def rag_items(tokenizer: Tokenizer, count: int, options: WorkloadOptions) -> list[WorkItem]:
    """`count` prompts of rag_tokens[0]..rag_tokens[1] tokens. With rag_contexts = K > 0
    the prompts share K contexts (long common prefixes, taken in turn or drawn as
    rag_hot_fraction says) and differ in their questions; with 0 every prompt has its own
    context."""
    if count == 0:
        return []
    rng = np.random.default_rng(options.seed + 1)
    lo, hi = options.rag_tokens
    passages = _passages(tokenizer)
    num_contexts = options.rag_contexts or count
    order = _context_order(count, num_contexts, options.rag_hot_fraction, options.seed)
    overhead = len(tokenizer.encode(_INSTRUCTION + "Question: " + max(QUESTIONS, key=len)))
    contexts = [
        _INSTRUCTION + _context(tokenizer, passages, int(rng.integers(lo, hi + 1)) - overhead)
        for _ in range(num_contexts)
    ]
    items = []
    for i in range(count):
        question = QUESTIONS[int(rng.integers(len(QUESTIONS)))]
        prompt = contexts[order[i]] + "Question: " + question
        answer = int(rng.integers(ANSWER_TOKENS[0], ANSWER_TOKENS[1] + 1))
        items.append(
            WorkItem(
                messages=[{"role": "user", "content": prompt}],
                max_tokens=min(answer, options.max_output_tokens),
                exact_length=True,
                kind="rag",
                long=True,
            )
        )
    return items


def _context_order(count: int, contexts: int, hot: float | None, seed: int) -> list[int]:
    """Each prompt's context: in turn, or drawn with the first one at `hot` and the
    others sharing the rest evenly (its own generator: the contexts and questions stay
    those of the same seed in turn)."""
    if hot is None:
        return [i % contexts for i in range(count)]
    if not 0 <= hot <= 1 or (contexts == 1 and hot < 1):
        raise ValueError(f"rag_hot_fraction must be in [0, 1] (1 for one context), got {hot}")
    rest = (1 - hot) / (contexts - 1) if contexts > 1 else 0.0
    weights = [hot] + [rest] * (contexts - 1)
    return [int(c) for c in np.random.default_rng(seed + 2).choice(contexts, count, p=weights)]
