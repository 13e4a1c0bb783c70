"""The persistent batch: request rows kept across steps, written only where they changed,
compacted in order when requests leave, and built into the same inputs as rows given
whole (InputBatch.build) for every backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.attention import AttentionSpec
from engine.attention_backends import select_attention_backend
from engine.cpu_attention import CpuAttention
from engine.graph_runner import pad_rows
from engine.input_batch import InputBatch
from engine.kv_cache import BlockManager
from engine.persistent_batch import PersistentBatch
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledSequence
from engine.sequence import Sequence
from tests.engine.test_input_batch import _values, batch_row

BLOCK = 16
CPU = torch.device("cpu")
NULL_BLOCK = 64  # past the block managers' 64
SPEC = AttentionSpec(CPU, torch.float32, torch.float32, 64)


def _batch(name: str = "torch", max_num_seqs: int = 8) -> PersistentBatch:
    if name == "cpu" and CpuAttention.unsupported(SPEC):
        pytest.skip(CpuAttention.unsupported(SPEC))
    inputs = InputBatch(
        select_attention_backend(name, SPEC),
        BLOCK,
        CPU,
        max_num_tokens=128,
        max_num_seqs=max_num_seqs,
        max_model_len=256,
        null_block=NULL_BLOCK,
        max_pad_tokens=3,
    )
    return PersistentBatch(inputs, max_model_len=256, max_query_len=4)


def _running(bm: BlockManager, name: str, num_tokens: int, computed: int) -> Sequence:
    seq = Sequence(name, [1000 + 7 * i + len(name) for i in range(num_tokens)], SamplingParams())
    seq.num_computed_tokens = computed
    assert bm.allocate(seq, num_tokens)
    return seq


def _decode(bm: BlockManager, seqs: list[Sequence], token: int) -> None:
    """What a decode step's update does: the sampled token appended, its input computed."""
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens
        seq.token_ids.append(token)
        assert bm.allocate(seq, seq.num_tokens)


def _row_of(batch: PersistentBatch, seq: Sequence) -> tuple[list[int], list[int]]:
    """A row's tokens and its table's entries (up to the first null)."""
    r = batch.row_of[seq.request_id]
    tokens = batch.token_ids[r, : batch.num_tokens[r]].tolist()
    table = batch.block_tables[r]
    return tokens, table[: int(np.argmax(table == NULL_BLOCK))].tolist()


def _step(batch: PersistentBatch, scheduled: list[ScheduledSequence]):
    step = batch.update(scheduled)
    return step, batch.build(scheduled, step)


def test_a_decode_step_writes_only_the_new_token_and_a_new_blocks_entry():
    bm = BlockManager(64, BLOCK, enable_prefix_caching=False)
    # The next decode's position: inside a block, and at a new block's first slot.
    seqs = [_running(bm, "a", 21, 20), _running(bm, "b", 32, 31)]
    batch = _batch()
    _step(batch, [ScheduledSequence.of(s, 1) for s in seqs])
    _decode(bm, seqs, 5)
    tokens, tables = batch.token_ids.copy(), batch.block_tables.copy()
    step, inputs = _step(batch, [ScheduledSequence.of(s, 1) for s in seqs])
    assert step.rows == [0, 1] and step.decodes is not None
    changed_tokens = list(zip(*np.nonzero(batch.token_ids != tokens), strict=True))
    assert changed_tokens == [(0, 21), (1, 32)]
    assert batch.token_ids[0, 21] == batch.token_ids[1, 32] == 5
    # "b" took a new block for position 32 (its third); "a" stays in its second.
    assert list(zip(*np.nonzero(batch.block_tables != tables), strict=True)) == [(1, 2)]
    assert batch.block_tables[1, 2] == seqs[1].block_table[2]
    assert inputs.positions.tolist() == [21, 32]
    assert inputs.input_ids.tolist() == [5, 5]


def test_compaction_after_removes_keeps_each_remaining_rows_tokens_and_table_in_order():
    bm = BlockManager(64, BLOCK, enable_prefix_caching=False)
    lengths = (5, 17, 40, 33, 16, 70)
    seqs = [_running(bm, name, n, n - 1) for name, n in zip("abcdef", lengths, strict=True)]
    batch = _batch()
    _step(batch, [ScheduledSequence.of(s, 1) for s in seqs])
    before = {s.request_id: _row_of(batch, s) for s in seqs}
    # "b" and "e" end (their blocks freed), "a" is left out of the step by the budget.
    for gone in (seqs[1], seqs[4]):
        bm.free_sequence(gone)
    kept = [seqs[2], seqs[3], seqs[5]]
    _decode(bm, kept, 9)
    step, inputs = _step(batch, [ScheduledSequence.of(s, 1) for s in kept])
    assert step.rows == [0, 1, 2] and batch.num_rows == 3
    for seq in kept:
        tokens, table = _row_of(batch, seq)
        assert tokens == before[seq.request_id][0] + [9] == seq.token_ids
        assert table == seq.block_table
    assert sorted(batch.row_of) == ["c", "d", "f"]
    assert (batch.block_tables[3:] == NULL_BLOCK).all()  # free rows read the null block
    assert inputs.positions.tolist() == [s.num_tokens - 1 for s in kept]
    want = [s.block_table[(s.num_tokens - 1) // BLOCK] * BLOCK for s in kept]
    assert inputs.attn_meta.slot_mapping.tolist() == [
        w + (s.num_tokens - 1) % BLOCK for w, s in zip(want, kept, strict=True)
    ]
    # "a" comes back after them; a new request after it.
    g = _running(bm, "g", 10, 0)
    _decode(bm, [seqs[0], *kept], 4)
    items = [ScheduledSequence.of(s, 1) for s in (*kept, seqs[0])] + [ScheduledSequence.of(g, 10)]
    step, _ = _step(batch, items)
    assert step.rows == [0, 1, 2, 3, 4]
    for seq in (*kept, seqs[0], g):
        assert _row_of(batch, seq) == (seq.token_ids, seq.block_table)


def test_a_request_back_from_preemption_gets_its_row_rewritten():
    """Its blocks were freed (a new table list): the row is written whole again, even
    when no step ran between (nothing removed its row)."""
    bm = BlockManager(64, BLOCK, enable_prefix_caching=False)
    seq = _running(bm, "a", 40, 39)
    other = _running(bm, "b", 20, 19)
    batch = _batch()
    _step(batch, [ScheduledSequence.of(s, 1) for s in (seq, other)])
    bm.free_sequence(seq)
    bm.free_sequence(other)  # "b" first takes other blocks
    other = _running(bm, "b2", 20, 19)
    seq.num_computed_tokens = 0
    assert bm.allocate(seq, seq.num_tokens)
    _, inputs = _step(batch, [ScheduledSequence.of(seq, 40)])
    assert _row_of(batch, seq) == (seq.token_ids, seq.block_table)
    assert inputs.input_ids.tolist() == seq.token_ids


def _mixed_step(bm: BlockManager) -> list[ScheduledSequence]:
    """A prompt's last chunk, a decode, a speculating decode and another decode."""
    chunk = _running(bm, "chunk", 36, 16)
    decode = _running(bm, "decode", 21, 20)
    spec = _running(bm, "spec", 30, 29)
    short = _running(bm, "short", 5, 4)
    proposals = (7, 8, 9)
    assert bm.allocate(spec, spec.num_tokens + len(proposals))
    return [
        ScheduledSequence.of(chunk, 20),
        ScheduledSequence.of(decode, 1),
        ScheduledSequence.of(spec, 1 + len(proposals), proposals),
        ScheduledSequence.of(short, 1),
    ]


@pytest.mark.parametrize("name", ["torch", "flash_reference", "cpu"])
@pytest.mark.parametrize("kind", ["decodes", "mixed", "padded"])
def test_the_rows_build_what_rows_given_whole_build(name, kind):
    """Every backend reads the persistent rows: the step's inputs and metadata hold what
    InputBatch.build writes for the same rows given whole (and padded to a bucket)."""
    bm = BlockManager(64, BLOCK, enable_prefix_caching=False)
    if kind == "mixed":
        scheduled = _mixed_step(bm)
    else:
        seqs = [_running(bm, str(i), n, n - 1) for i, n in enumerate((5, 16, 17, 40, 33))]
        scheduled = [ScheduledSequence.of(s, 1) for s in seqs]
        if kind == "padded":  # a verification among them, padded to 3 tokens and 8 rows
            assert bm.allocate(seqs[2], seqs[2].num_tokens + 2)
            scheduled[2] = ScheduledSequence.of(seqs[2], 3, (4, 5))
    key = (8, 3) if kind == "padded" else None
    batch = _batch(name)
    # A step before, with other rows, so that this one reuses the buffers.
    _step(batch, [ScheduledSequence.of(_running(bm, "x", 9, 8), 1)])
    step = batch.update(scheduled)
    got = _values(batch.build(scheduled, step, key))
    rows = [batch_row(item) for item in scheduled]
    if key is not None:
        rows = pad_rows(rows, key)
    want = _values(_batch(name).inputs.build(rows))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w) if isinstance(w, torch.Tensor) else g == w
