"""Runs one scheduled step on the model: builds the flat batch, forwards, samples.

The runner knows nothing of policy; it gets (sequence, number of new tokens,
proposed tokens) triples and returns the new tokens of each sequence that
reached its end: one sampled token, or the accepted proposals plus one.
"""

from __future__ import annotations

import torch

from engine.attention import SequenceSlice, select_attention_backend
from engine.kv_cache import allocate_kv_cache, slot_of
from engine.model import CausalLM
from engine.sampler import Sampler
from engine.sampling_params import MAX_SEED
from engine.scheduler import ScheduledSequence
from engine.sequence import Sequence
from engine.spec.draft import DraftProposer
from engine.spec.verifier import verify_greedy, verify_sampled


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        *,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        attention_backend: str,
        seed: int,
    ) -> None:
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.device = device
        self.attention = select_attention_backend(attention_backend, device)
        self.kv_caches = allocate_kv_cache(
            cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim, dtype, device
        )
        self.sampler = Sampler(device, seed)
        self.drafter: DraftProposer | None = None  # set by the engine for draft-model spec

    def _to_device(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(self.device, non_blocking=True)

    def _seeded_generator(self, seq: Sequence) -> torch.Generator | None:
        """A seeded request's generator for its next token; None for the batch's own (and
        for a greedy request, which draws nothing)."""
        if seq.params.seed is None or seq.params.greedy:
            return None
        return self.position_generators(seq, 1)[0]

    def position_generators(
        self, seq: Sequence, count: int, salt: int = 0
    ) -> list[torch.Generator]:
        """Randomness for the next `count` output positions of seq. A seeded request
        gets a generator keyed by (seed, position, salt): what it draws at a position
        does not depend on how many proposals earlier steps verified, so its output is
        reproducible, alone or in any batch, speculating or not. Unseeded requests
        share the engine's generator."""
        seed = seq.params.seed
        if seed is None:
            return [self.sampler.generator] * count
        gens = []
        for position in range(seq.num_tokens, seq.num_tokens + count):
            gen = torch.Generator(device=self.device)
            gen.manual_seed(hash((seed, position, salt)) & MAX_SEED)
            gens.append(gen)
        return gens

    def execute(
        self, batch: list[ScheduledSequence], draft_probs: dict[str, torch.Tensor]
    ) -> list[list[int]]:
        """The new tokens of each sequence in batch that samples, in batch order.

        draft_probs: the draft model's probabilities of a sampled request's
        proposals; requests without an entry had point-mass (n-gram or greedy) drafts.
        """
        logits = self.compute_logits(batch)
        if logits is None:
            return []
        sampling = [item for item in batch if item.samples]
        # Row offsets: each sampling sequence owns 1 + len(spec_token_ids) rows.
        starts = [0]
        for item in sampling:
            starts.append(starts[-1] + 1 + len(item.spec_token_ids))
        plain = [i for i, item in enumerate(sampling) if not item.spec_token_ids]
        out: list[list[int]] = [[] for _ in sampling]
        if plain:
            rows = self._to_device([starts[i] for i in plain])
            tokens = self.sampler(
                logits[rows],
                [sampling[i].seq.params for i in plain],
                [self._seeded_generator(sampling[i].seq) for i in plain],
            )
            for i, token in zip(plain, tokens, strict=True):
                out[i] = [token]
        speculating = [i for i, item in enumerate(sampling) if item.spec_token_ids]
        # One argmax (one device sync) serves every greedy verification in the batch.
        greedy = speculating and any(sampling[i].seq.params.greedy for i in speculating)
        argmax = logits.argmax(dim=-1).tolist() if greedy else []
        for i in speculating:
            seq, drafts = sampling[i].seq, list(sampling[i].spec_token_ids)
            if seq.params.greedy:
                out[i] = verify_greedy(drafts, argmax[starts[i] : starts[i + 1]])
            else:
                out[i] = verify_sampled(
                    logits[starts[i] : starts[i + 1]],
                    drafts,
                    draft_probs.get(seq.request_id),
                    seq.params,
                    self.position_generators(seq, len(drafts) + 1),
                )
        return out

    @torch.inference_mode()
    def compute_logits(self, batch: list[ScheduledSequence]) -> torch.Tensor | None:
        """Forwards the batch (writing its KV); float32 logits of the sampling rows: the
        last token's, and for a speculating sequence also each proposed token's."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        slices: list[SequenceSlice] = []
        logit_rows: list[int] = []
        for item in batch:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            table = seq.block_table
            input_ids += seq.token_ids[start : end - len(item.spec_token_ids)]
            input_ids += item.spec_token_ids
            positions += range(start, end)
            slots += [slot_of(table, p, bs) for p in range(start, end)]
            slices.append(SequenceSlice(item.num_new_tokens, end, table))
            if item.samples:
                last = len(input_ids)
                logit_rows += range(last - 1 - len(item.spec_token_ids), last)
        ids_t, pos_t, slot_t = (self._to_device(x) for x in (input_ids, positions, slots))
        meta = self.attention.build_metadata(slices, slot_t, bs)
        hidden = self.model(ids_t, pos_t, self.attention, self.kv_caches, meta)
        if self.drafter is not None:
            self.drafter.keep_in_step(ids_t, pos_t, meta)
        if not logit_rows:
            return None
        rows = self._to_device(logit_rows)
        return self.model.compute_logits(hidden[rows])
