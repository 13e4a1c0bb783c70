"""Speculative decoding's bookkeeping: after each step, choose k per decoding
sequence (SpecPolicy), get proposals (n-gram lookup or the draft model), and count
what verification kept."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field

import torch

from engine.kv_cache import BlockManager
from engine.metrics import EngineStats
from engine.sequence import Sequence
from engine.speculative.draft import DraftProposer
from engine.speculative.ngram import NgramProposer
from engine.speculative.policy import SpecPolicy


@dataclass(eq=False)
class Speculator:
    """Proposes with `ngram` or with `drafter` (one of them)."""

    max_k: int
    block_manager: BlockManager
    max_model_len: int
    stats: EngineStats
    _: KW_ONLY
    ngram: NgramProposer | None = None
    drafter: DraftProposer | None = None
    description: str = ""
    policy: SpecPolicy = field(init=False)
    # The draft model's probabilities of each sampled request's latest proposals.
    draft_probs: dict[str, torch.Tensor] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.policy = SpecPolicy(uses_draft_model=self.drafter is not None)

    def cap(self, seq: Sequence) -> int:
        """The most drafts worth proposing: accepted drafts plus the one new token must
        fit max_tokens and the context, so the output never overshoots."""
        if not seq.params.speculate or seq.num_uncomputed_tokens != 1:  # or still prefilling
            return 0
        left = min(
            seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens
        )
        return max(0, min(self.max_k, left - 1))

    def record(self, seq: Sequence, num_drafts: int, num_tokens: int) -> None:
        """A verification of num_drafts proposals that yielded num_tokens new tokens."""
        if not num_drafts:
            return
        accepted = num_tokens - 1
        self.policy.record(seq.request_id, num_drafts, accepted)
        self.stats.spec_num_drafts += 1
        self.stats.spec_draft_tokens += num_drafts
        self.stats.spec_accepted_tokens += accepted
        seq.metrics.spec_draft_tokens += num_drafts
        seq.metrics.spec_accepted_tokens += accepted

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        self.policy.observe_step(num_tokens, seconds)

    def propose(
        self,
        running: Iterable[Sequence],
        other_tokens: int,
        generators: Callable[[Sequence, int], list[torch.Generator]],
    ) -> None:
        """Sets spec_token_ids of each running decode for the next step.

        generators(seq, k): randomness for a sampled request's k draft positions.
        """
        seqs = list(running)
        caps = {s.request_id: self.cap(s) for s in seqs}
        seeded = frozenset(s.request_id for s in seqs if s.params.seed is not None)
        ks = self.policy.choose({r: c for r, c in caps.items() if c}, other_tokens, seeded)
        self.draft_probs.clear()
        if self.ngram is not None:
            for seq in seqs:
                k = ks.get(seq.request_id, 0)
                seq.spec_token_ids = (
                    self.ngram.propose(seq.request_id, seq.token_ids, k) if k else []
                )
            return
        assert self.drafter is not None
        todo: list[tuple[Sequence, int]] = []
        for seq in seqs:
            seq.spec_token_ids = []
            k = ks.get(seq.request_id, 0)
            # The draft writes KV at the positions of its inputs: the last token and
            # k - 1 drafts. Their slots must exist; without blocks, no guess.
            if k and self.block_manager.allocate(seq, seq.num_tokens - 1 + k):
                todo.append((seq, k))
        if not todo:
            return
        proposals = self.drafter.propose(todo, generators)
        self.policy.observe_draft(self.drafter.last_forwards, self.drafter.last_seconds)
        for (seq, _), (tokens, probs) in zip(todo, proposals, strict=True):
            seq.spec_token_ids = tokens
            if probs is not None:
                self.draft_probs[seq.request_id] = probs

    def release(self, request_id: str) -> None:
        self.policy.release(request_id)
        if self.ngram is not None:
            self.ngram.release(request_id)
