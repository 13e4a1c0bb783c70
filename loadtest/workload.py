"""Workloads: the requests a load test sends, built ahead of the run.

- `sharegpt`: real first turns from ShareGPT with their reference answer lengths.
- `rag`: long prompts (passages of real ShareGPT text plus a question), short answers.
- `repeat`: questions asked again in other words, for the semantic cache.
- `mixed`: ShareGPT chat with a fraction of rag prompts mixed in at random.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from loadtest.rag import rag_items
from loadtest.repeat import repeat_items
from loadtest.work_item import WorkItem, WorkloadOptions

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

WORKLOADS = ("sharegpt", "rag", "repeat", "mixed")
# Workloads whose purpose is cache hits: a run of one whose misses were cut at the output
# limit stored nothing to hit, and its report says so.
CACHE_WORKLOADS = frozenset({"repeat"})


def build_workload(name: str, options: WorkloadOptions) -> list[WorkItem]:
    from loadtest.tokens import load_tokenizer  # imports torch: not for `--help`

    if name == "repeat":
        return repeat_items(options.num_requests, options.max_output_tokens, options.seed)
    tokenizer = load_tokenizer(options.tokenizer)
    if name == "sharegpt":
        return sharegpt_items(tokenizer, options.num_requests, options)
    if name == "rag":
        return rag_items(tokenizer, options.num_requests, options)
    if name != "mixed":
        raise ValueError(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS)}")
    rng = np.random.default_rng(options.seed)
    is_long = rng.random(options.num_requests) < options.long_fraction
    chat = iter(sharegpt_items(tokenizer, int((~is_long).sum()), options))
    rag = iter(rag_items(tokenizer, int(is_long.sum()), options))
    return [next(rag) if long else next(chat) for long in is_long]


def sharegpt_items(tokenizer: Tokenizer, count: int, options: WorkloadOptions) -> list[WorkItem]:
    from bench.sharegpt import sample_requests

    if count == 0:
        return []
    pairs = sample_requests(tokenizer, count, options.max_prompt_tokens, options.max_output_tokens)
    return [
        WorkItem(
            messages=[{"role": "user", "content": prompt}],
            max_tokens=output_len,
            exact_length=True,
            kind="sharegpt",
        )
        for prompt, output_len in pairs
    ]
