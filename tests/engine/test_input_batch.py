"""The input batch: persistent buffers, the backend's row order, slots and positions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention import AttentionBackend, AttentionSpec
from engine.attention_backends import select_attention_backend
from engine.cpu_attention import CpuAttention
from engine.input_batch import BatchRow, InputBatch, ModelInputs
from engine.kv_cache import BlockManager
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSequence
from engine.sequence import Sequence
from engine.torch_attention import TorchAttention

BLOCK = 16
CPU = torch.device("cpu")
NULL_BLOCK = 32  # past the block managers' 32
TORCH = TorchAttention(AttentionSpec(CPU, torch.float32, torch.float32, 64))


def _builder(
    max_num_tokens: int = 64, max_num_seqs: int = 8, backend: AttentionBackend = TORCH
) -> InputBatch:
    return InputBatch(
        backend,
        BLOCK,
        CPU,
        max_num_tokens=max_num_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=256,
        null_block=NULL_BLOCK,
    )


def batch_row(item: ScheduledSequence) -> BatchRow:
    """A scheduled sequence's part of a step, given whole: this step's share of its
    tokens, then its proposals; logits for its last token and each proposal when the
    step reaches it."""
    seq, start = item.seq, item.seq.num_computed_tokens
    spec = item.spec_token_ids
    token_ids = seq.token_ids[start : start + item.num_new_tokens - len(spec)] + list(spec)
    return BatchRow(token_ids, start, seq.block_table, 1 + len(spec) if item.samples else 0)


def _sequence(name: str, num_tokens: int, computed: int) -> Sequence:
    params = SamplingParams(max_tokens=16)
    seq = Sequence(name, list(range(100, 100 + num_tokens)), params)
    seq.num_computed_tokens = computed
    return seq


def test_steps_of_one_size_reuse_the_same_buffers():
    bm = BlockManager(32, BLOCK, enable_prefix_caching=False)
    seqs = [_sequence(str(i), n, n - 1) for i, n in enumerate((5, 20, 40))]
    for seq in seqs:
        assert bm.allocate(seq, seq.num_tokens + 1)
    builder = _builder()

    def step() -> list[torch.Tensor]:
        inputs = builder.build([batch_row(ScheduledSequence.of(s, 1)) for s in seqs])
        short = inputs.attn_meta.short
        return [
            inputs.input_ids,
            inputs.positions,
            inputs.logit_rows,
            inputs.attn_meta.slot_mapping,
            short.block_tables,
            short.pad_index,
            short.unpad_index,
        ]

    first = [t.data_ptr() for t in step()]
    positions = step()[1].tolist()
    for seq in seqs:  # one decode step later: new tokens, new positions, same memory
        seq.token_ids.append(7)
        seq.num_computed_tokens += 1
    second = step()
    assert [t.data_ptr() for t in second] == first
    assert second[1].tolist() == [p + 1 for p in positions]


def test_rows_go_short_first_and_logits_come_back_in_the_given_order():
    """A prompt's last chunk, a decode, a speculating decode and another decode,
    scheduled in that order: the backend takes the short queries first."""
    bm = BlockManager(32, BLOCK, enable_prefix_caching=False)
    chunk = _sequence("chunk", 36, 16)  # positions 16..35 this step
    decode = _sequence("decode", 21, 20)
    spec = _sequence("spec", 30, 29)
    short = _sequence("short", 5, 4)
    # Interleaved allocations: the tables are not runs of consecutive blocks.
    for seq, n in ((chunk, 16), (decode, 21), (chunk, 36), (spec, 33), (short, 5)):
        assert bm.allocate(seq, n)
    proposals = (7, 8, 9)
    scheduled = [
        ScheduledSequence.of(chunk, 20),
        ScheduledSequence.of(decode, 1),
        ScheduledSequence.of(spec, 1 + len(proposals), proposals),
        ScheduledSequence.of(short, 1),
    ]
    inputs = _builder().build([batch_row(item) for item in scheduled])

    # Built order: decode, spec, short (stable), then the chunk.
    parts = [
        (decode, [decode.token_ids[20]], range(20, 21)),
        (spec, [spec.token_ids[29], *proposals], range(29, 33)),
        (short, [short.token_ids[4]], range(4, 5)),
        (chunk, chunk.token_ids[16:36], range(16, 36)),
    ]
    ids = [t for _, tokens, _ in parts for t in tokens]
    positions = [p for _, _, span in parts for p in span]
    slots = [_slot_of(seq.block_table, p) for seq, _, span in parts for p in span]
    assert inputs.input_ids.tolist() == ids
    assert inputs.positions.tolist() == positions
    assert inputs.attn_meta.slot_mapping.tolist() == slots
    # Logit rows in the scheduled order: the chunk's last row, the decode's, the
    # speculating row's last token and each proposal, the short decode's.
    assert inputs.logit_rows.tolist() == [25, 0, 1, 2, 3, 4, 5]
    meta = inputs.attn_meta
    assert meta.short.num_tokens == 6
    # Tables of 2, 3 and 1 blocks, padded with the null block to the widest (masked keys).
    assert meta.short.block_tables.tolist() == [
        [*decode.block_table, NULL_BLOCK],
        spec.block_table,
        [*short.block_table, NULL_BLOCK, NULL_BLOCK],
    ]
    [c] = meta.chunks
    assert (c.start, c.end) == (6, 26)
    assert c.block_ids.tolist() == chunk.block_table


def test_a_block_size_the_backend_cannot_take_is_refused():
    with pytest.raises(ValueError, match="multiple of 16"):
        InputBatch(
            TORCH, 8, CPU, max_num_tokens=64, max_num_seqs=8, max_model_len=256, null_block=0
        )


def test_a_step_over_the_sizes_is_refused():
    bm = BlockManager(32, BLOCK, enable_prefix_caching=False)
    seq = _sequence("long", 40, 0)
    assert bm.allocate(seq, 40)
    with pytest.raises(ValueError, match="40 tokens"):
        _builder(max_num_tokens=32).build([batch_row(ScheduledSequence.of(seq, 40))])


@pytest.mark.parametrize("name", ["torch", "flash_reference", "cpu"])
def test_a_step_of_decodes_builds_what_any_step_builds(name):
    """build() writes a step of decodes alone on a path of its own (the commonest step,
    kept to few library calls): its inputs and metadata hold what the path for every
    other step writes for the same rows."""
    spec = AttentionSpec(CPU, torch.float32, torch.float32, 64)
    if name == "cpu" and CpuAttention.unsupported(spec):
        pytest.skip(CpuAttention.unsupported(spec))
    backend = select_attention_backend(name, spec)
    bm = BlockManager(32, BLOCK, enable_prefix_caching=False)
    # Contexts ending inside a block, on its last slot and at a new block's first.
    seqs = [_sequence(str(i), n, n - 1) for i, n in enumerate((5, 16, 17, 40, 33))]
    for seq in seqs:
        assert bm.allocate(seq, seq.num_tokens)
    rows = [batch_row(ScheduledSequence.of(s, 1)) for s in seqs]
    # Buffers just the step's size: a step that fills them.
    decodes, general = (_builder(5, 5, backend) for _ in range(2))
    fast, slow = decodes.build(rows), general._build_rows(rows)
    assert fast.attn_meta.__class__ is slow.attn_meta.__class__
    for got, want in zip(_values(fast), _values(slow), strict=True):
        assert torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want
    positions = [s.num_tokens - 1 for s in seqs]
    assert fast.positions.tolist() == positions
    if name == "cpu":  # its builder has a branch of its own for a token a row, on both paths
        assert fast.attn_meta.token_row.tolist() == list(range(len(seqs)))
        assert fast.attn_meta.token_keys.tolist() == [p + 1 for p in positions]


def _values(inputs: ModelInputs) -> list[object]:
    """The inputs' tensors and the metadata's every value, nested dataclasses flattened."""

    def flat(value: object) -> list[object]:
        if dataclasses.is_dataclass(value):
            return [v for f in dataclasses.fields(value) for v in flat(getattr(value, f.name))]
        if isinstance(value, list):
            return [v for item in value for v in flat(item)]
        return [value]

    return [inputs.input_ids, inputs.positions, inputs.logit_rows, *flat(inputs.attn_meta)]


def _slot_of(block_table: list[int], position: int) -> int:
    """The flat KV-cache slot of a token position: its block's first slot plus the offset."""
    return block_table[position // BLOCK] * BLOCK + position % BLOCK
