"""Builds a step's flat batch (token ids, positions, KV slots, block tables, logit rows)
into persistent buffers, from rows given whole (the draft model's steps, CUDA graph
capture, tools). The target model's steps come from the request rows that
engine/persistent_batch.py keeps across steps, built into these same buffers.

Every buffer is allocated once, sized for the largest step (max_num_batched_tokens
tokens, max_num_seqs sequences), and a step uses views of its first rows: a step of
a given size reads the same memory every time, as CUDA graph replay needs. The host
side is written through numpy (pinned memory on CUDA) and copied to the device
without blocking; on CPU both sides are one tensor.

Rows go in the order the attention backend asks for (its short queries first); the
logit rows come back in the order the rows were given.

Padding (engine/graph_runner.py) is tokens a step computes for nobody: trailing pad
tokens of a row, or whole rows of them. They read and write the null block, a KV
block past the block manager's that no sequence owns: their keys and values land
there, never in a real block, and a table's unused entries name it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from engine.attention import AttentionBackend, AttentionBatch, StepLimits
from engine.staged_buffer import StagedBuffer


class BatchRow(NamedTuple):
    """One sequence's part of a step."""

    token_ids: list[int]  # its input tokens this step, proposed tokens included
    start: int  # the position of the first
    block_table: list[int]  # blocks for every position up to start + len(token_ids)
    num_logits: int  # the last token_ids whose logits the step wants (0: none)
    num_pad: int = 0  # pad tokens after token_ids (see the module docstring)


@dataclass
class ModelInputs:
    """What the model's forward takes, and which of its output rows to keep."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_meta: Any
    logit_rows: torch.Tensor  # flat rows of the wanted logits, in the given rows' order
    # Whether logit_rows is every flat row in order (a step of decodes): the hidden states
    # are the logits' input as they are, no rows picked.
    every_row: bool = False


class InputBatch:
    """Builds each step's ModelInputs from BatchRows into persistent buffers."""

    def __init__(
        self,
        attention: AttentionBackend,
        block_size: int,
        device: torch.device,
        *,
        max_num_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        null_block: int,
        max_pad_tokens: int = 0,
    ) -> None:
        """max_pad_tokens: the most pad tokens a row may take past its last token."""
        if block_size % attention.block_size_multiple:
            raise ValueError(
                f"the {attention.name} attention backend needs a block size that is a "
                f"multiple of {attention.block_size_multiple}, not {block_size}"
            )
        self.attention = attention
        self.block_size = block_size
        self.max_model_len = max_model_len
        # Blocks of the longest sequence, pad tokens past its end included.
        max_blocks = -(-(max_model_len + max_pad_tokens) // block_size)
        # The largest step: these buffers' capacities, and the backend builder's.
        self.limits = StepLimits(max_num_seqs, max_num_tokens, max_blocks, block_size, null_block)
        self.input_ids = StagedBuffer(max_num_tokens, device)
        self.positions = StagedBuffer(max_num_tokens, device)
        self.slot_mapping = StagedBuffer(max_num_tokens, device)
        self.logit_rows = StagedBuffer(max_num_tokens, device)
        # Host only: what the attention metadata is derived from. Row i of a step's
        # [n, width] tables is entries i * width ..: the view is contiguous. A tensor's
        # memory, which the CPU kernel reads in place.
        self.block_tables_host = torch.zeros(max_num_seqs * max_blocks, dtype=torch.long)
        self.block_tables = self.block_tables_host.numpy()
        self.query_lens = np.zeros(max_num_seqs, dtype=np.int64)
        self.starts = np.zeros(max_num_seqs, dtype=np.int64)
        self.context_lens = np.zeros(max_num_seqs, dtype=np.int64)
        self.query_start = np.zeros(max_num_seqs + 1, dtype=np.int64)  # [0] stays 0
        self.table_lens = np.zeros(max_num_seqs, dtype=np.int64)
        self.is_pad = np.zeros(max_num_tokens, dtype=bool)
        # Token offsets, and a step of decodes' query starts (0 .. n).
        self.arange = np.arange(max(max_num_tokens, max_num_seqs + 1), dtype=np.int64)
        self.metadata = attention.metadata_builder(self.limits)
        # (rows, real rows) when query_lens, query_start and logit_rows hold the last
        # build's step of decodes (a token and its logits a row), which the next such step
        # of that size need not write again (engine/persistent_batch.py); None after any
        # other build.
        self.decode_layout: tuple[int, int] | None = None
        # The host buffers are rewritten by the next build: it first waits until this
        # build's copies have read them (a step that samples syncs anyway, a step of
        # prefill chunks alone does not).
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def build(self, rows: list[BatchRow]) -> ModelInputs:
        """The step's inputs: views of the buffers, valid until the next build."""
        self.decode_layout = None
        if all(len(row.token_ids) == row.num_logits == 1 and not row.num_pad for row in rows):
            return self._build_decodes(rows)
        return self._build_rows(rows)

    def _build_rows(self, rows: list[BatchRow]) -> ModelInputs:
        """build() for any step: prefill chunks, verifications, pads."""
        n = len(rows)
        order = self._order(rows)
        bs = self.block_size
        ids: list[int] = []
        qlens: list[int] = []
        starts: list[int] = []
        tlens: list[int] = []
        pads: list[int] = []
        ends = [0] * n  # each given row's end in the flat batch, pads included
        for i in order:
            token_ids, row_start, table, _, num_pad = rows[i]
            ids += token_ids
            if num_pad:
                ids += [0] * num_pad
            ends[i] = len(ids)
            query_len = len(token_ids) + num_pad
            qlens.append(query_len)
            starts.append(row_start)
            pads.append(num_pad)
            # Pad tokens past the table's end see (and so need) the null block.
            tlens.append(max(len(table), (row_start + query_len + bs - 1) // bs))
        num_tokens, width = len(ids), max(tlens)
        self.check_fits(num_tokens, n, width)
        self.input_ids.np[:num_tokens] = ids
        q, start, ctx = self.query_lens[:n], self.starts[:n], self.context_lens[:n]
        q[:] = qlens
        start[:] = starts
        np.add(start, q, out=ctx)
        query_start = self.query_start[: n + 1]
        np.cumsum(q, out=query_start[1:])
        tables = self._write_tables([rows[i] for i in order], tlens, width)
        # A token's position is its row's start plus its offset in the row.
        row_of = np.repeat(self.arange[:n], q)
        positions = self.positions.np[:num_tokens]
        np.add(self.arange[:num_tokens], (start - query_start[:n])[row_of], out=positions)
        slots = self.slot_mapping.np[:num_tokens]
        np.add(tables[row_of, positions // bs] * bs, positions % bs, out=slots)
        if any(pads):
            is_pad = self.is_pad[:num_tokens]
            np.greater_equal(positions, (ctx - pads)[row_of], out=is_pad)
            # Pads write the null block, never a real one; past the context length
            # they take its last position (their outputs are never read).
            slots[is_pad] = self.limits.null_block * bs + positions[is_pad] % bs
            np.minimum(positions, self.max_model_len - 1, out=positions)
        logit_rows: list[int] = []
        for i, row in enumerate(rows):
            if row.num_logits:
                last = ends[i] - row.num_pad
                logit_rows += range(last - row.num_logits, last)
        self.logit_rows.np[: len(logit_rows)] = logit_rows
        return self.finish(n, num_tokens, len(logit_rows), tables)

    def _build_decodes(self, rows: list[BatchRow]) -> ModelInputs:
        """build() for a step of decodes alone (one token a row, its logits wanted), the
        commonest step by far: the same buffers, from Python lists and a few copies. A
        step's host time goes mostly to cache misses (the forward before it evicts the
        step loop's code), so fewer library calls matter more here than vectorizing."""
        n, bs = len(rows), self.block_size
        starts = [row.start for row in rows]
        tlens = [len(row.block_table) for row in rows]
        width = max(tlens)
        self.check_fits(n, n, width)
        self.input_ids.np[:n] = [row.token_ids[0] for row in rows]
        self.positions.np[:n] = starts
        self.slot_mapping.np[:n] = [
            row.block_table[start // bs] * bs + start % bs
            for row, start in zip(rows, starts, strict=True)
        ]
        self.query_lens[:n] = 1
        self.starts[:n] = starts
        np.add(self.starts[:n], 1, out=self.context_lens[:n])
        self.query_start[: n + 1] = self.arange[: n + 1]
        tables = self._write_tables(rows, tlens, width)
        self.logit_rows.np[:n] = self.arange[:n]
        return self.finish(n, n, n, tables)

    def check_fits(self, num_tokens: int, n: int, width: int) -> None:
        """Raises unless a step of this size fits the buffers; then waits until the
        previous build's copies have read them (a CUDA event)."""
        lim = self.limits
        if num_tokens > lim.max_num_tokens or n > lim.max_num_seqs or width > lim.max_blocks:
            raise ValueError(
                f"a step of {num_tokens} tokens, {n} sequences and {width} blocks a sequence "
                f"exceeds the input batch's {lim.max_num_tokens}, {lim.max_num_seqs} "
                f"and {lim.max_blocks}"
            )
        if self._copied is not None:
            self._copied.synchronize()

    def _write_tables(self, ordered: list[BatchRow], tlens: list[int], width: int) -> np.ndarray:
        """The rows' block tables as an [n, width] view, each padded with the null block
        (all of them as one list: one copy into numpy)."""
        n = len(ordered)
        self.table_lens[:n] = tlens
        null = [self.limits.null_block] * width
        flat: list[int] = []
        for row in ordered:
            table = row.block_table
            flat += table
            flat += null[len(table) :]
        self.block_tables[: n * width] = flat
        return self.block_tables[: n * width].reshape(n, width)

    def finish(
        self, n: int, num_tokens: int, num_logits: int, tables: np.ndarray, every_row: bool = False
    ) -> ModelInputs:
        """The device views of the first n rows' buffers, and the backend's metadata over
        `tables` ([n, width] host block tables, any row stride), once a build (this one's,
        or engine/persistent_batch.py's) has written them."""
        batch = AttentionBatch(
            self.block_size,
            self.query_lens[:n],
            self.context_lens[:n],
            self.query_start[: n + 1],
            self.table_lens[:n],
            tables,
            self.slot_mapping.copy(num_tokens),
        )
        inputs = ModelInputs(
            self.input_ids.copy(num_tokens),
            self.positions.copy(num_tokens),
            self.metadata.build(batch),
            self.logit_rows.copy(num_logits),
            every_row,
        )
        if self._copied is not None:
            self._copied.record()
        return inputs

    def _order(self, rows: list[BatchRow]) -> list[int]:
        """The rows' indices in the backend's order: a stable partition that puts the
        queries of at most max_short_query tokens first, when the backend asks."""
        limit = self.attention.max_short_query
        if not limit:
            return list(range(len(rows)))
        short = [i for i, row in enumerate(rows) if len(row.token_ids) + row.num_pad <= limit]
        if len(short) == len(rows):
            return short
        taken = set(short)
        return short + [i for i in range(len(rows)) if i not in taken]
