"""Draft-model proposals: a smaller model sharing the target's tokenizer runs k cheap
one-token steps per speculating sequence.

Two kinds of draft:
- self-draft: the target's own first L layers plus its final norm and head. Its KV
  for those layers is exactly the target's (same weights, same inputs), so it reads
  and writes the target's cache and needs no memory or upkeep of its own;
- a separate model: its own paged KV cache with the target's block layout (same
  block ids and slots), fed every token the target computes, so its cache stays in
  step with the target's through prefill, prefix-cache hits and preemption.

Draft steps write KV at the positions after the sequence's last token, into slots
the engine allocated beforehand. The target's verification rewrites those slots
with its own KV, and slots of rejected tokens are rewritten when the sequence gets
there, so nothing needs undoing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from engine.input_batch import BatchRow, InputBatch, ModelInputs
from engine.model import CausalLM
from engine.sampler import race, sampling_probs
from engine.sequence import Sequence


class DraftProposer:
    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[torch.Tensor],
        num_layers: int,
        inputs: InputBatch,
        shares_target_kv: bool,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.num_layers = num_layers
        self.inputs = inputs  # the target's builder: its step is over when the draft runs
        self.shares_target_kv = shares_target_kv
        self.last_forwards = 0
        self.last_seconds = 0.0

    def keep_in_step(self, step: ModelInputs) -> None:
        """Writes a separate draft's KV for the tokens the target just computed."""
        if not self.shares_target_kv:
            self._forward(step)

    def _forward(self, step: ModelInputs) -> torch.Tensor:
        return self.model(
            step.input_ids,
            step.positions,
            self.inputs.attention,
            self.kv_caches,
            step.attn_meta,
            self.num_layers,
        )

    @torch.inference_mode()
    def propose(
        self,
        seqs: list[tuple[Sequence, int]],
        generators: Callable[[Sequence, int], list[torch.Generator]],
    ) -> list[tuple[list[int], torch.Tensor | None]]:
        """Up to k tokens for each (sequence, k), and their draft probabilities
        ([k, vocab], or None for greedy requests, whose drafts are the draft's argmax).

        generators(seq, k): the randomness of a sampled request's k draft positions.
        """
        gens = [generators(seq, k) if not seq.params.greedy else [] for seq, k in seqs]
        started = time.perf_counter()
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        depth = max(k for _, k in seqs)
        for j in range(depth):
            rows = [i for i, (_, k) in enumerate(seqs) if k > j]
            # Step j feeds each sequence's newest token: its last, then its latest draft.
            batch: list[BatchRow] = []
            for i in rows:
                seq = seqs[i][0]
                token = drafts[i][-1] if j else seq.token_ids[-1]
                batch.append(BatchRow([token], seq.num_tokens - 1 + j, seq.block_table, 1))
            step = self.inputs.build(batch)
            logits = self.model.compute_logits(self._forward(step)[step.logit_rows])
            params = [seqs[i][0].params for i in rows]
            greedy = logits.argmax(dim=-1).tolist()
            q = None if all(p.greedy for p in params) else sampling_probs(logits, params)
            for r, i in enumerate(rows):
                if q is None or params[r].greedy:
                    drafts[i].append(greedy[r])
                else:
                    drafts[i].append(int(race(q[r], gens[i][j])))
                    probs[i].append(q[r])
        self.last_forwards = depth
        self.last_seconds = time.perf_counter() - started
        return [(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs, strict=True)]
