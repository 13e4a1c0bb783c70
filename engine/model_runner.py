"""Runs one scheduled step on the model: builds the flat batch, forwards, samples.

The runner knows nothing of policy; it gets (sequence, number of new tokens,
proposed tokens) triples and returns the new tokens of each sequence that
reached its end: one sampled token, or the accepted proposals plus one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from engine.attention import AttentionBackend
from engine.graph_runner import GraphKey, GraphRunner, batch_buckets
from engine.input_batch import InputBatch, ModelInputs
from engine.model import CausalLM
from engine.persistent_batch import PersistentBatch
from engine.sampler import Sampler
from engine.sampling_params import MAX_SEED, SamplingParams
from engine.scheduler import ScheduledSequence
from engine.sequence import Sequence
from engine.speculative.draft import DraftProposer
from engine.speculative.verifier import verify_greedy, verify_sampled


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        *,
        attention: AttentionBackend,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        device: torch.device,
        enforce_eager: bool,
        max_spec_tokens: int,
        seed: int,
    ) -> None:
        """max_spec_tokens: the most proposals a sequence gets in one step (0 without
        speculation); enforce_eager: no bucket padding, no CUDA graphs."""
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.device = device
        self.attention = attention
        max_query_len = 1 + max_spec_tokens
        max_num_tokens = max_num_batched_tokens
        if not enforce_eager:  # a bucket of verification rows, padded, is one step
            max_num_tokens = max(max_num_tokens, batch_buckets(max_num_seqs)[-1] * max_query_len)
        # One builder serves the target's steps and the draft's: the target's step is
        # over (its logits consumed) before the draft proposes.
        self.inputs = InputBatch(
            self.attention,
            block_size,
            device,
            max_num_tokens=max_num_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            null_block=num_blocks,
            max_pad_tokens=max_spec_tokens if not enforce_eager else 0,
        )
        # The target's steps, from request rows kept across steps, into those buffers.
        self.rows = PersistentBatch(self.inputs, max_model_len, max_query_len)
        # One block more than the block manager's: the null block (see InputBatch).
        self.kv_caches = self.attention.allocate_kv_cache(
            cfg.num_layers, num_blocks + 1, block_size, cfg.num_kv_heads, cfg.head_dim
        )
        self.graphs = (
            None
            if enforce_eager
            else GraphRunner(
                model,
                self.attention,
                self.kv_caches,
                self.inputs,
                max_num_seqs=max_num_seqs,
                max_query_len=max_query_len,
                capture=device.type == "cuda",
            )
        )
        self.sampler = Sampler(device, seed)
        self._no_tokens = torch.empty(0, dtype=torch.long, device=device)
        # Whether the last compute_logits was a step of decodes alone, its logits one row
        # a sequence in batch order.
        self.decoded = False
        # A draft model's proposer, given by the engine that built it: each step writes a
        # separate draft's KV for the tokens the target computed. None without one.
        self.drafter: DraftProposer | None = None

    def capture_graphs(self) -> None:
        """Captures the decode steps' CUDA graphs (on CUDA, unless enforce_eager)."""
        if self.graphs is not None:
            self.graphs.capture_graphs()

    @property
    def graph_mode(self) -> str:
        """How decode steps run, for logs and stats."""
        if self.graphs is None:
            return "eager"
        if self.graphs.graphs:
            return f"CUDA graphs for batch sizes {self.graphs.buckets}"
        return "padded to batch sizes, eagerly"

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
        if self.decoded:  # one token a sequence, each sampling, none speculating
            if not self.rows.num_random:
                return [[token] for token in self.sampler(logits, None, [])]
            return [[token] for token in self._sample([item.seq for item in batch], logits)]
        sampling = [item for item in batch if item.samples]
        speculating = [i for i, item in enumerate(sampling) if item.spec_token_ids]
        if not speculating:  # most steps: one row a sampling sequence, in batch order
            return [[token] for token in self._sample([item.seq for item in sampling], logits)]
        # Row offsets: each sampling sequence owns 1 + len(spec_token_ids) rows.
        starts = [0]
        for item in sampling:
            starts.append(starts[-1] + 1 + len(item.spec_token_ids))
        plain = [i for i, item in enumerate(sampling) if not item.spec_token_ids]
        out: list[list[int]] = [[] for _ in sampling]
        if plain:
            logits_of_plain = logits[self._to_device([starts[i] for i in plain])]
            tokens = self._sample([sampling[i].seq for i in plain], logits_of_plain)
            for i, token in zip(plain, tokens, strict=True):
                out[i] = [token]
        # One argmax (one device sync) serves every greedy verification in the batch.
        greedy = any(sampling[i].seq.params.greedy for i in speculating)
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

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """One token for each sequence from its row of logits."""
        return self.sampler(logits, *self._sampling(seqs))

    def _sampling(
        self, seqs: list[Sequence]
    ) -> tuple[list[SamplingParams] | None, list[torch.Generator | None]]:
        """The sampler's params and generators for seqs' rows: none when every row of
        the step is greedy (it draws nothing)."""
        if not self.rows.num_random:
            return None, []
        return [seq.params for seq in seqs], [self._seeded_generator(seq) for seq in seqs]

    def compute_logits(self, batch: list[ScheduledSequence]) -> torch.Tensor | None:
        """Forwards the batch (writing its KV); float32 logits of the sampling rows in
        batch order: the last token's, and for a speculating sequence also each
        proposed token's. A step of decodes and verifications runs padded to its
        bucket (engine/graph_runner.py) unless enforce_eager."""
        inputs, key = self._build(batch)
        return self._logits(inputs, key)

    def _build(self, batch: list[ScheduledSequence]) -> tuple[ModelInputs, GraphKey | None]:
        """The step's inputs, in the step buffers, and its graph runner bucket."""
        step = self.rows.update(batch)
        graphs = self.graphs
        key = None
        if graphs is not None and step.all_logits:
            key = graphs.plan(len(batch), step.max_query)
        return self.rows.build(batch, step, key), key

    def _logits(self, inputs: ModelInputs, key: GraphKey | None) -> torch.Tensor | None:
        """compute_logits after the build. The model's forward and logits run in
        inference mode; what is between them needs none (entering it here too cost a
        step ~40 us of host time)."""
        graphs = self.graphs
        if graphs is not None and key is not None:
            hidden = graphs.run(inputs, key)
        else:  # forward itself: Module.__call__'s hook checks cost a step ~10 us
            hidden = self.model.forward(
                inputs.input_ids, inputs.positions, self.attention, self.kv_caches, inputs.attn_meta
            )
        if self.drafter is not None:
            self.drafter.keep_in_step(inputs)
        if not len(inputs.logit_rows):
            return None
        self.decoded = inputs.every_row
        if inputs.every_row:  # a step of decodes: each row is a sequence's last token
            return self.model.compute_logits(hidden)
        return self.model.compute_logits(hidden.index_select(0, inputs.logit_rows))

    def prepare(self, batch: list[ScheduledSequence], previous: torch.Tensor | None) -> AheadStep:
        """Async scheduling's half of a step on the caller's thread (engine/async_step.py):
        builds the step's inputs and reads what its sampling needs from the sequences,
        which the caller changes while run() runs. A placeholder input token (-1 - j,
        engine/async_scheduler.py) becomes row j of `previous`, the step before's
        sampled tokens on the device (on CUDA maybe not computed yet: the stream
        computes them before this step reads them). No speculation here."""
        inputs, key = self._build(batch)
        ids = self.inputs.input_ids.np[: len(inputs.input_ids)]
        at = np.flatnonzero(ids < 0)
        if len(at):
            assert previous is not None  # placeholders are that step's
            rows = -1 - ids[at]
            if self.device.type == "cpu":  # the host buffer is the input tensor
                ids[at] = previous.numpy()[rows]
            else:  # the host buffer's copy is on its way: the device's copy is patched
                where = torch.from_numpy(at).to(self.device, non_blocking=True)
                taken = torch.from_numpy(rows).to(self.device, non_blocking=True)
                inputs.input_ids[where] = previous[taken]
        params, generators = self._sampling([item.seq for item in batch if item.samples])
        return AheadStep(inputs, key, params, generators)

    def run(self, step: AheadStep) -> SampledTokens:
        """The other half: forward and sample (on a CPU, on the worker thread of
        engine/async_step.py; on CUDA, launched on the caller's, without waiting). The
        sampled tokens, one a sampling sequence in batch order."""
        logits = self._logits(step.inputs, step.key)
        if logits is None:
            return SampledTokens(self._no_tokens, self._no_tokens, None)
        tokens = self.sampler.sample(logits, step.params, step.generators)
        if tokens.device.type == "cpu":
            return SampledTokens(tokens, tokens, None)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return SampledTokens(tokens, host, copied)


class AheadStep(NamedTuple):
    """A step prepared for ModelRunner.run: its inputs and its sampling's parameters."""

    inputs: ModelInputs
    key: GraphKey | None
    params: list[SamplingParams] | None  # None: every row greedy
    generators: list[torch.Generator | None]


class SampledTokens(NamedTuple):
    """A step's sampled tokens on the device, where the next step's placeholders read
    them, and on the host, once `copied` has happened (None: on a CPU, one tensor)."""

    device: torch.Tensor
    host: torch.Tensor
    copied: torch.cuda.Event | None

    def tolist(self) -> list[int]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.host.tolist()
