"""What a workload is made of: the requests (WorkItem) and the knobs that shape them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkItem:
    messages: list[dict[str, str]]
    max_tokens: int
    # The workload sets the output length: sent with ignore_eos where the run allows it.
    exact_length: bool
    kind: str
    long: bool = False


@dataclass(frozen=True)
class WorkloadOptions:
    num_requests: int
    max_prompt_tokens: int = 1024  # cap on ShareGPT prompts
    max_output_tokens: int = 128  # cap on every answer
    rag_tokens: tuple[int, int] = (1024, 4096)  # range of the rag prompts' lengths
    rag_contexts: int = 0  # distinct rag contexts shared by the questions; 0: one each
    # None: the shared contexts in turn; a share: each question's context drawn at random,
    # the first (the hot one) with this probability, the others evenly (1/K: all evenly).
    rag_hot_fraction: float | None = None
    long_fraction: float = 0.2  # mixed: share of rag prompts
    tokenizer: str = "smollm2-135m-instruct"
    seed: int = 0
