"""The graph runner on a CPU, where its padded steps run eagerly: what CUDA graphs rely
on. A step padded to its bucket gives its real rows the same bits as the step run as
it is; its buffers keep their addresses from step to step; nothing in the step reads
a value back to the host; and generation is unchanged, speculation included.
scripts/gpu-check captures and replays the same steps on a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine import LLM, SamplingParams
from engine.graph_runner import _signature, batch_buckets, pad_rows
from engine.input_batch import BatchRow
from engine.llm_engine import LLMEngine
from tests.engine.conftest import GREEDY_32, needs_kernels
from tests.engine.prompts import PROMPTS

BACKENDS = [
    pytest.param({}, id="cpu", marks=needs_kernels),
    pytest.param({"attention_backend": "torch"}, id="torch"),
    # The flash backend's metadata and layout over its reference kernel; a short context
    # keeps the reference's memory (batch x context keys) small.
    pytest.param(
        {"attention_backend": "flash_reference", "max_model_len": 512, "block_size": 16},
        id="flash",
    ),
]


@pytest.fixture(params=BACKENDS)
def backend(request) -> dict[str, object]:
    return request.param


def test_batch_buckets():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 96, 100]
    assert batch_buckets(5) == [1, 2, 4, 5]
    assert batch_buckets(1) == [1]


def _running(engine: LLMEngine, prompts: list[str]) -> list:
    """The prompts' sequences once each has its first token (the next step decodes)."""
    ids = [engine.add_request(p, SamplingParams(max_tokens=64, temperature=0.0)) for p in prompts]
    seqs = [engine.sequences[i] for i in ids]
    while any(s.num_output_tokens == 0 for s in seqs):
        engine.step()
    return seqs


def _logits_both_ways(engine: LLMEngine, rows: list[BatchRow]) -> tuple[torch.Tensor, ...]:
    """The rows' logits as one step as it is, then padded to its bucket (the same KV
    written twice: the real rows' keys and values, and the pads' into the null block)."""
    runner = engine.runner
    model = runner.model
    inputs = runner.inputs.build(rows)
    hidden = model(
        inputs.input_ids, inputs.positions, runner.attention, runner.kv_caches, inputs.attn_meta
    )
    eager = model.compute_logits(hidden[inputs.logit_rows])
    key = runner.graphs.plan(len(rows), max(len(row.token_ids) for row in rows))
    assert key is not None and key[0] > len(rows)  # a bucket with pad rows
    padded_inputs = runner.inputs.build(pad_rows(rows, key))
    hidden = runner.graphs.run(padded_inputs, key)
    padded = model.compute_logits(hidden[padded_inputs.logit_rows])
    return eager, padded


def test_a_padded_decode_step_gives_the_real_rows_the_same_bits(make_llm, backend):
    engine = make_llm(**backend, enforce_eager=False).engine
    seqs = _running(engine, PROMPTS[4:7])  # 3 rows: bucket 4
    try:
        rows = [BatchRow([s.token_ids[-1]], s.num_tokens - 1, s.block_table, 1) for s in seqs]
        eager, padded = _logits_both_ways(engine, rows)
        assert torch.equal(eager, padded)
    finally:
        for s in seqs:
            engine.abort(s.request_id)


def test_a_padded_verification_step_gives_the_real_rows_the_same_bits(make_llm, backend):
    """Rows of 1, 3 and 2 tokens (a decode and two verifications) padded to 3 tokens a
    row and 4 rows: the pads ride after each row's proposals."""
    engine = make_llm(**backend, enforce_eager=False, spec_method="ngram", num_spec_tokens=4).engine
    seqs = _running(engine, PROMPTS[4:7])
    try:
        rows = []
        for seq, proposals in zip(seqs, ([], [11, 12], [13]), strict=True):
            assert engine.block_manager.allocate(seq, seq.num_tokens + len(proposals))
            tokens = [seq.token_ids[-1], *proposals]
            rows.append(BatchRow(tokens, seq.num_tokens - 1, seq.block_table, len(tokens)))
        eager, padded = _logits_both_ways(engine, rows)
        assert eager.shape[0] == 6 and torch.equal(eager, padded)
    finally:
        for s in seqs:
            engine.abort(s.request_id)


def test_padded_steps_generate_what_eager_steps_do(make_llm, backend):
    prompts = PROMPTS[4:9]  # 5 rows: bucket 8, then fewer as they finish
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (8, 20, 32)]
    params += [GREEDY_32, SamplingParams(max_tokens=24, temperature=0.8, seed=7)]
    eager = make_llm(**backend).generate(prompts, params)
    padded = make_llm(**backend, enforce_eager=False).generate(prompts, params)
    assert [o.token_ids for o in padded] == [o.token_ids for o in eager]


@needs_kernels
def test_padded_speculation_is_lossless(make_llm):
    prompts = PROMPTS[4:8]
    reference = make_llm(prefix_caching=False).generate(prompts, GREEDY_32)
    llm: LLM = make_llm(spec_method="ngram", num_spec_tokens=5, enforce_eager=False)
    outputs = llm.generate(prompts, GREEDY_32)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]
    assert llm.engine.stats.spec_accepted_tokens > 0
    # Verification steps ran padded (the runner keeps one signature per bucket it ran).
    assert any(q > 1 for _, q in llm.engine.runner.graphs.signatures)


def test_a_buckets_steps_read_the_same_buffers(make_llm):
    """For the graphable backend every step of one bucket reads the same tensors at the
    same addresses with the same shapes and host bounds (the runner checks each step
    against its bucket's first, so a whole generation passing proves it again)."""
    engine = make_llm(**BACKENDS[2].values[0], enforce_eager=False).engine
    seqs = _running(engine, PROMPTS[4:7])
    try:
        signatures = []
        for _ in range(3):
            scheduled = engine.scheduler.schedule()
            step = engine.runner.rows.update(scheduled)
            key = engine.runner.graphs.plan(len(scheduled), step.max_query)
            inputs = engine.runner.rows.build(scheduled, step, key)
            engine.runner.graphs.run(inputs, key)
            signatures.append(_signature(inputs))
            engine.scheduler.update(scheduled, [[7]] * len(scheduled))
        assert signatures[0] == signatures[1] == signatures[2]
        assert engine.runner.graphs.signatures[key] == signatures[0]
    finally:
        for s in seqs:
            engine.abort(s.request_id)


class HostReads(TorchDispatchMode):
    """Records the ops that move a value from a tensor to the host (each a device sync
    on CUDA, and not allowed while a CUDA graph captures)."""

    READS = ("_local_scalar_dense", "item", "nonzero", "masked_select", "is_nonzero", "equal")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.READS:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def test_nothing_in_a_padded_step_reads_back_to_the_host(make_llm, backend):
    engine = make_llm(**backend, enforce_eager=False).engine
    seqs = _running(engine, PROMPTS[4:7])
    try:
        rows = [BatchRow([s.token_ids[-1]], s.num_tokens - 1, s.block_table, 1) for s in seqs]
        graphs = engine.runner.graphs
        key = graphs.plan(len(rows), 1)
        inputs = engine.runner.inputs.build(pad_rows(rows, key))
        with HostReads() as mode:
            graphs.forward(inputs)
        assert mode.reads == []
        with HostReads() as mode:  # the detector itself sees a read
            inputs.input_ids.max().item()
        assert mode.reads
    finally:
        for s in seqs:
            engine.abort(s.request_id)
