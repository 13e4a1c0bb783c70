"""Request rows that live across steps (vLLM's persistent InputBatch): the target
model's steps are built from them.

Each request in a step keeps one row of fixed buffers, allocated once: its token ids
(prompt and output so far, and this step's proposals after them) and its block table
(padded with the null block). A step writes only what changed since the last: for a
decode, the token the last step appended and the table's entries from the block of
its first position on (a new block, or blocks given back after rejected proposals);
its positions and slots are derived from the rows by a few array operations.

Rows 0..n-1 hold exactly the step's n requests. A request that a step does not
schedule (finished, preempted, or left out by the budget) loses its row, the rows
after it move up (compacted, as vLLM's `condense` does), and a new request takes the
row after the last: the rows keep the order the requests came in, the scheduler's
order of its running decodes, so a steady stream of decodes reads the same rows in
the same order step after step. Rows past n are free, with null tables: what a padded
step's pad rows read. The attention backends read the rows' tables in place.

A row is known by its request id and by its block table, the list itself: the block
manager gives a sequence a new list whenever it frees its blocks (a preemption, an
end), so a request that comes back rewrites its row whole.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from engine.graph_runner import GraphKey
from engine.input_batch import InputBatch, ModelInputs
from engine.scheduler import ScheduledSequence
from engine.sequence import Sequence


class StepRows(NamedTuple):
    """A step's scheduled sequences placed in rows: what build() reads."""

    rows: list[int]  # each scheduled sequence's row, in scheduled order
    starts: list[int]  # the position of its first token this step
    table_lens: list[int]  # entries in its block table
    max_query: int  # the longest query (proposals included)
    all_logits: bool  # every token of every row wants its logits (a graph runner step)
    # A step of decodes (one token a row, its logits wanted) in rows 0..n-1 in scheduled
    # order, the commonest step by far: each row's input token and KV slot, else None.
    decodes: tuple[list[int], list[int]] | None


class PersistentBatch:
    def __init__(self, inputs: InputBatch, max_model_len: int, max_query_len: int) -> None:
        """inputs: the step buffers the rows are built into; max_query_len: 1 + the most
        proposals a row verifies."""
        limits = inputs.limits
        self.inputs = inputs
        self.block_size = limits.block_size
        self.null_block = limits.null_block
        self.max_model_len = max_model_len
        max_rows, self.width = limits.max_num_seqs, limits.max_blocks
        self.row_len = max_model_len + max_query_len  # a row's tokens, its proposals too
        self.token_ids = np.zeros((max_rows, self.row_len), dtype=np.int32)
        # A tensor's memory, which the CPU kernel reads in place.
        self.block_tables_host = torch.full((max_rows, self.width), self.null_block)
        self.block_tables = self.block_tables_host.numpy()
        # Flat views, for a step's scattered writes and gathers in one call each.
        self._tokens = self.token_ids.reshape(-1)
        self._tables = self.block_tables.reshape(-1)
        # Each row's request, what was written into it, and whether it samples at random;
        # Python lists: the step loop reads them one row at a time.
        self.request_ids: list[str | None] = [None] * max_rows
        self.row_of: dict[str, int] = {}
        self.tables: list[list[int] | None] = [None] * max_rows  # the sequence's own list
        self.num_tokens = [0] * max_rows
        self.table_lens = [0] * max_rows
        self.random = [False] * max_rows
        self.num_rows = 0  # rows 0..num_rows - 1 are taken (no holes between steps)
        self.num_random = 0  # rows whose requests sample at random (not greedy)
        self.arange = np.arange(max(limits.max_num_tokens, max_rows + 1), dtype=np.int64)

    def update(self, scheduled: list[ScheduledSequence]) -> StepRows:
        """Places the step's sequences in rows 0..n-1 and writes what changed in them."""
        bs, row_len, width, null = self.block_size, self.row_len, self.width, self.null_block
        row_of, tables, num_tokens, table_lens = (
            self.row_of,
            self.tables,
            self.num_tokens,
            self.table_lens,
        )
        rows: list[int] = []
        starts: list[int] = []
        lens: list[int] = []
        missing: list[int] = []  # scheduled sequences without a (current) row
        token_at: list[int] = []  # flat indices and values of changed tokens and entries
        token_ids: list[int] = []
        entry_at: list[int] = []
        entries: list[int] = []
        inputs: list[int] = []  # a decode's input token and KV slot
        slots: list[int] = []
        max_query, all_logits = 1, True
        for seq, num_new, spec, samples in scheduled:
            start, table, tokens = seq.num_computed_tokens, seq.block_table, seq.token_ids
            starts.append(start)
            lens.append(len(table))
            if num_new == 1:
                inputs.append(tokens[start])
                slots.append(table[start // bs] * bs + start % bs)
            elif num_new > max_query:
                max_query = num_new
            if all_logits and (not samples or num_new != 1 + len(spec)):
                all_logits = False
            r = row_of.get(seq.request_id, -1)
            if r < 0 or tables[r] is not table:
                missing.append(len(rows))
                rows.append(-1)
                continue
            rows.append(r)
            have = num_tokens[r]
            if len(tokens) == have + 1:  # the token the last step appended
                token_at.append(r * row_len + have)
                token_ids.append(tokens[have])
                num_tokens[r] = have + 1
            elif len(tokens) != have:  # the tokens of a verification
                base = r * row_len
                token_at += range(base + have, base + len(tokens))
                token_ids += tokens[have:]
                num_tokens[r] = len(tokens)
            # The table from the block of the first position on (entries before it are
            # for computed tokens, never given back while the request runs): for a decode,
            # a new block or blocks given back after rejected proposals.
            first, base, old = start // bs, r * width, table_lens[r]
            if start % bs == 0 or len(table) != old or first + 1 != len(table):
                entry_at += range(base + first, base + len(table))
                entries += table[first:]
                if old > len(table):  # blocks given back: their entries null again
                    entry_at += range(base + len(table), base + old)
                    entries += [null] * (old - len(table))
                table_lens[r] = len(table)
        if token_at:
            self._tokens[token_at] = token_ids
        if entry_at:
            self._tables[entry_at] = entries
        if len(rows) - len(missing) != len(row_of):  # some row's request is not in the step
            moved = self._free_unscheduled(set(rows))
            rows = [moved.get(r, r) for r in rows]
        for i in missing:
            rows[i] = self._add(scheduled[i].seq)
        decodes = None
        if max_query == 1 and all_logits and rows == list(range(len(rows))):
            decodes = (inputs, slots)
        return StepRows(rows, starts, lens, max_query, all_logits, decodes)

    def build(
        self, scheduled: list[ScheduledSequence], step: StepRows, key: GraphKey | None = None
    ) -> ModelInputs:
        """The step's inputs from its rows (padded to the graph runner's bucket `key`):
        views of the step buffers, valid until the next build."""
        if step.decodes is not None and (key is None or key[1] == 1):
            return self._build_decodes(step, step.decodes, key[0] if key else len(step.rows))
        return self._build_rows(scheduled, step, key)

    def _build_decodes(
        self, step: StepRows, decodes: tuple[list[int], list[int]], bucket: int
    ) -> ModelInputs:
        """A step of decodes in rows 0..n-1 in order: one token a row, then rows
        n..bucket-1 of one pad token each (position 0 of the null block). Few library
        calls: a step's host time goes mostly to cache misses (the forward before it
        evicts the step loop's code), so fewer calls matter more than vectorizing."""
        inputs = self.inputs
        n = len(step.rows)
        width = max(max(step.table_lens), 1)
        inputs.check_fits(bucket, bucket, width)
        token_ids, slots = decodes
        if bucket > n:  # pad rows
            token_ids = token_ids + [0] * (bucket - n)
            slots = slots + [self.null_block * self.block_size] * (bucket - n)
            step = step._replace(starts=step.starts + [0] * (bucket - n))
            step = step._replace(table_lens=step.table_lens + [1] * (bucket - n))
        inputs.input_ids.np[:bucket] = token_ids
        inputs.slot_mapping.np[:bucket] = slots
        positions = inputs.positions.np[:bucket]
        positions[:] = step.starts
        np.add(positions, 1, out=inputs.context_lens[:bucket])
        inputs.table_lens[:bucket] = step.table_lens
        if inputs.decode_layout != (bucket, n):  # else the last build wrote these
            inputs.query_lens[:bucket] = 1
            inputs.query_start[: bucket + 1] = self.arange[: bucket + 1]
            inputs.logit_rows.np[:n] = self.arange[:n]
            inputs.decode_layout = (bucket, n)
        return inputs.finish(bucket, bucket, n, self.block_tables[:bucket, :width], bucket == n)

    def _build_rows(
        self, scheduled: list[ScheduledSequence], step: StepRows, key: GraphKey | None
    ) -> ModelInputs:
        """Any step: prefill chunks, verifications, pads (InputBatch's general build, over
        the rows)."""
        inputs, bs, row_len = self.inputs, self.block_size, self.row_len
        inputs.decode_layout = None
        n = len(scheduled)
        bucket, query_len = key if key is not None else (n, 0)
        # Per row (row order), the query's tokens, pads after them, and logits wanted.
        qlens = np.full(bucket, query_len, dtype=np.int64)
        pads = np.full(bucket, query_len, dtype=np.int64)
        starts = np.zeros(bucket, dtype=np.int64)
        tlens = np.zeros(bucket, dtype=np.int64)
        num_logits = np.zeros(bucket, dtype=np.int64)
        rows = step.rows
        for item, r, start, tlen in zip(scheduled, rows, step.starts, step.table_lens, strict=True):
            spec = item.spec_token_ids
            if spec:  # proposals ride after the sequence's last token
                at = r * row_len + start + item.num_new_tokens - len(spec)
                self._tokens[at : at + len(spec)] = spec
            starts[r] = start
            tlens[r] = tlen
            if key is None:
                qlens[r], pads[r] = item.num_new_tokens, 0
            else:
                pads[r] = query_len - item.num_new_tokens
            num_logits[r] = 1 + len(spec) if item.samples else 0
        order = self._order(qlens, n)
        if order is not None:
            qlens, pads, starts, tlens, num_logits = (
                a[order] for a in (qlens, pads, starts, tlens, num_logits)
            )
        # Pad tokens past a table's end see (and so need) the null block.
        np.maximum(tlens, (starts + qlens + bs - 1) // bs, out=tlens)
        num_tokens, width = int(qlens.sum()), int(tlens.max())
        inputs.check_fits(num_tokens, bucket, width)
        q, ctx = inputs.query_lens[:bucket], inputs.context_lens[:bucket]
        q[:] = qlens
        np.add(starts, qlens, out=ctx)
        query_start = inputs.query_start[: bucket + 1]
        np.cumsum(q, out=query_start[1:])
        inputs.table_lens[:bucket] = tlens
        if order is None:
            tables = self.block_tables[:bucket, :width]
            row_ids = self.arange[:bucket]
        else:
            tables = self.block_tables[order, :width]
            row_ids = order
        row_of = np.repeat(self.arange[:bucket], qlens)
        positions = inputs.positions.np[:num_tokens]
        np.add(self.arange[:num_tokens], (starts - query_start[:-1])[row_of], out=positions)
        is_pad = inputs.is_pad[:num_tokens]
        np.greater_equal(positions, (ctx - pads)[row_of], out=is_pad)
        real = np.minimum(positions, row_len - 1)
        ids = inputs.input_ids.np[:num_tokens]
        ids[:] = self._tokens[row_ids[row_of] * row_len + real]
        slots = inputs.slot_mapping.np[:num_tokens]
        np.add(tables[row_of, positions // bs] * bs, positions % bs, out=slots)
        if pads.any():
            # Pads write the null block, never a real one; past the context length they
            # take its last position (their outputs are never read).
            ids[is_pad] = 0
            slots[is_pad] = self.null_block * bs + positions[is_pad] % bs
            np.minimum(positions, self.max_model_len - 1, out=positions)
        # Logit rows in scheduled order: each row's last num_logits real tokens.
        step_index = np.empty(bucket, dtype=np.int64)
        step_index[row_ids] = self.arange[:bucket]
        ends = query_start[1:] - pads
        wanted = [(int(ends[j]), int(num_logits[j])) for j in step_index[rows].tolist()]
        logit_rows = [t for end, k in wanted for t in range(end - k, end)]
        inputs.logit_rows.np[: len(logit_rows)] = logit_rows
        return inputs.finish(bucket, num_tokens, len(logit_rows), tables)

    def _order(self, qlens: np.ndarray, n: int) -> np.ndarray | None:
        """The rows in the backend's order when it asks for its short queries first and
        they are not (a stable partition), else None: rows in their order."""
        limit = self.inputs.attention.max_short_query
        if not limit:
            return None
        short = qlens[:n] <= limit
        if short.all() or not short[np.argmin(short) :].any():
            return None
        order = np.concatenate((np.flatnonzero(short), np.flatnonzero(~short)))
        return np.concatenate((order, self.arange[n : len(qlens)]))

    def _add(self, seq: Sequence) -> int:
        """A row for seq after the taken ones, written whole."""
        r = self.num_rows
        tokens, table = seq.token_ids, seq.block_table
        self.token_ids[r, : len(tokens)] = tokens
        self.block_tables[r, : len(table)] = table
        self.request_ids[r] = seq.request_id
        self.row_of[seq.request_id] = r
        self.tables[r] = table
        self.num_tokens[r] = len(tokens)
        self.table_lens[r] = len(table)
        self.random[r] = not seq.params.greedy
        self.num_random += self.random[r]
        self.num_rows += 1
        return r

    def _free_unscheduled(self, scheduled_rows: set[int]) -> dict[int, int]:
        """Frees every row whose request the step does not schedule, then moves the rows
        after each hole up, in order (vLLM condenses too, but moves its last rows into
        the holes): the rows stay in the order their requests came in, which is the
        scheduler's order of its running decodes. Freed rows get null tables again, for
        pad rows and the next request. Returns {old row: new row} of the rows moved."""
        keep = [r for r in range(self.num_rows) if r in scheduled_rows]
        for r in range(self.num_rows):
            if r not in scheduled_rows:
                del self.row_of[self.request_ids[r] or ""]
        n = len(keep)
        if keep != list(range(n)):
            # A row's entries past its table are null, so copying as wide as the widest
            # row overwritten leaves none of the row that was there before.
            longest = max((self.num_tokens[r] for r in keep), default=0)
            widest = max(self.table_lens[: self.num_rows])
            self.token_ids[:n, :longest] = self.token_ids[keep, :longest]
            self.block_tables[:n, :widest] = self.block_tables[keep, :widest]
        self.block_tables[n : self.num_rows] = self.null_block
        for name, empty in _FREE_ROW.items():
            values = getattr(self, name)
            values[:n] = [values[r] for r in keep]
            values[n : self.num_rows] = [empty] * (self.num_rows - n)
        moved = {r: i for i, r in enumerate(keep) if r != i}
        for i in moved.values():
            self.row_of[self.request_ids[i] or ""] = i
        self.num_rows = n
        self.num_random = sum(self.random[:n])
        return moved


# What a free row's per-row values are.
_FREE_ROW: dict[str, object] = {
    "request_ids": None,
    "tables": None,
    "num_tokens": 0,
    "table_lens": 0,
    "random": False,
}
