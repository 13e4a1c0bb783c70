"""The repeat workload: questions asked again in other words (loadtest/data/paraphrases.json).

Questions come in blocks of a few: each block asks its questions once, then each of their
paraphrases in turn, so every question's first ask is a cache miss and its later asks,
arriving a few requests later, can be served from the cache. Answers end by themselves
(no ignore_eos): only complete answers are cacheable.
"""

from __future__ import annotations

import json
from importlib import resources

import numpy as np

from loadtest.work_item import WorkItem

SYSTEM = "Answer in one short sentence."
BLOCK = 8  # questions asked side by side before their paraphrases


def question_groups() -> list[list[str]]:
    """Each question followed by its paraphrases."""
    text = resources.files("loadtest").joinpath("data/paraphrases.json").read_text()
    return [[entry["question"], *entry["paraphrases"]] for entry in json.loads(text)]


def repeat_order(groups: list[list[str]], count: int, seed: int) -> list[tuple[int, int]]:
    """(group, ask) pairs, ask 0 being the first ask; groups in a seeded random order,
    cycled again (then all repeats) when `count` outruns them."""
    order = np.random.default_rng(seed).permutation(len(groups)).tolist()
    asks: list[tuple[int, int]] = []
    while len(asks) < count:
        for start in range(0, len(order), BLOCK):
            block = order[start : start + BLOCK]
            for ask in range(max(len(groups[g]) for g in block)):
                asks += [(g, ask) for g in block if ask < len(groups[g])]
    return asks[:count]


def repeat_items(count: int, max_tokens: int, seed: int) -> list[WorkItem]:
    groups = question_groups()
    return [
        WorkItem(
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": groups[g][ask]},
            ],
            max_tokens=max_tokens,
            exact_length=False,
            kind="repeat",
        )
        for g, ask in repeat_order(groups, count, seed)
    ]
