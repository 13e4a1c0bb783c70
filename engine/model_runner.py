"""Runs one scheduled step on the model: builds the flat batch, forwards, samples.

The runner knows nothing of policy; it gets (sequence, number of new tokens)
pairs and returns one sampled token for each sequence that reached its end.
"""

from __future__ import annotations

import torch

from engine.attention import SequenceSlice, select_attention_backend
from engine.kv_cache import allocate_kv_cache
from engine.model import CausalLM
from engine.sampler import Sampler
from engine.scheduler import ScheduledSequence


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
        self.generators: dict[str, torch.Generator] = {}

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self.generators.get(request_id)
        if gen is None:
            gen = self.generators[request_id] = torch.Generator(device=self.device)
            gen.manual_seed(seed)
        return gen

    def _to_device(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(self.device, non_blocking=True)

    def release(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    def execute(self, batch: list[ScheduledSequence]) -> list[int]:
        """Returns the new token of each sequence in batch that samples, in batch order."""
        logits = self.compute_logits(batch)
        if logits is None:
            return []
        sampling = [item for item in batch if item.samples]
        return self.sampler(
            logits,
            [item.seq.params for item in sampling],
            [self._generator(item.seq.request_id, item.seq.params.seed) for item in sampling],
        )

    @torch.inference_mode()
    def compute_logits(self, batch: list[ScheduledSequence]) -> torch.Tensor | None:
        """Forwards the batch (writing its KV); float32 next-token logits of the sampling rows."""
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
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            slices.append(SequenceSlice(item.num_new_tokens, end, table))
            if item.samples:
                logit_rows.append(len(input_ids) - 1)
        ids_t, pos_t, slot_t = (self._to_device(x) for x in (input_ids, positions, slots))
        meta = self.attention.build_metadata(slices, slot_t, bs)
        hidden = self.model(ids_t, pos_t, self.attention, self.kv_caches, meta)
        if not logit_rows:
            return None
        rows = self._to_device(logit_rows)
        return self.model.compute_logits(hidden[rows])
