"""A request as the scheduler sees it: tokens, progress, blocks, and status."""

from __future__ import annotations

from enum import Enum, auto
from typing import Any, TypedDict

from engine.metrics import RequestMetrics
from engine.sampling_params import SamplingParams


class RequestOptions(TypedDict, total=False):
    """What a request may name besides its prompt and sampling parameters: its id (else a
    new one), the salt that scopes its prefix-cache blocks (only requests with the same
    salt share them), and vLLM's P/D `kv_transfer_params` (engine/kv_connector.py)."""

    request_id: str | None
    cache_salt: str | None
    kv_transfer_params: dict[str, Any] | None


class Status(Enum):
    WAITING = auto()
    LOADING = auto()  # its KV is being loaded from outside (engine/kv_connector.py)
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    # Slots: the step loop reads a handful of these for every running sequence.
    __slots__ = (
        "block_hashes",
        "block_table",
        "cache_salt",
        "finish_reason",
        "kv_transfer_params",
        "metrics",
        "num_computed_tokens",
        "num_prompt_tokens",
        "params",
        "request_id",
        "spec_token_ids",
        "status",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> None:
        self.request_id = request_id
        self.cache_salt = cache_salt  # prefix-cache blocks are shared only under one salt
        # vLLM's P/D protocol (engine/kv_connector.py): what the request brought, and once
        # it is finished, what its connector answers for the next server.
        self.kv_transfer_params = kv_transfer_params
        self.token_ids = list(prompt_token_ids)  # prompt, then output
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.status = Status.WAITING
        # Tokens whose KV is in the cache. A preempted sequence drops back to 0
        # and recomputes prompt + output so far (preemption by recompute).
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # chained hashes of its full, computed blocks
        self.spec_token_ids: list[int] = []  # proposed continuation, verified next step
        self.finish_reason: str | None = None
        self.metrics = RequestMetrics()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
