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

from engine.attention import AttentionBackend, SequenceSlice
from engine.kv_cache import slot_of
from engine.model import CausalLM
from engine.sampler import race, sampling_probs
from engine.sequence import Sequence


class DraftProposer:
    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[torch.Tensor],
        num_layers: int,
        attention: AttentionBackend,
        block_size: int,
        shares_target_kv: bool,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.num_layers = num_layers
        self.attention = attention
        self.block_size = block_size
        self.shares_target_kv = shares_target_kv
        self.last_forwards = 0
        self.last_seconds = 0.0

    def keep_in_step(self, ids: torch.Tensor, positions: torch.Tensor, meta: object) -> None:
        """Writes a separate draft's KV for the tokens the target just computed."""
        if not self.shares_target_kv:
            self.model(ids, positions, self.attention, self.kv_caches, meta, self.num_layers)

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
        device = self.model.embed.device
        bs = self.block_size
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        depth = max(k for _, k in seqs)
        for j in range(depth):
            rows = [i for i, (_, k) in enumerate(seqs) if k > j]
            ids, positions, slots, slices = [], [], [], []
            for i in rows:
                seq = seqs[i][0]
                pos = seq.num_tokens - 1 + j
                table = seq.block_table
                ids.append(drafts[i][-1] if j else seq.token_ids[-1])
                positions.append(pos)
                slots.append(slot_of(table, pos, bs))
                slices.append(SequenceSlice(1, pos + 1, table))
            ids_t, pos_t, slot_t = (
                torch.tensor(x, dtype=torch.long, device=device) for x in (ids, positions, slots)
            )
            meta = self.attention.build_metadata(slices, slot_t, bs)
            hidden = self.model(ids_t, pos_t, self.attention, self.kv_caches, meta, self.num_layers)
            logits = self.model.compute_logits(hidden)
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
