"""Within each weight mode, greedy output does not depend on scheduling: batching,
chunked prefill, prefix caching, speculation and async scheduling. test_equivalence.py,
test_speculative.py and test_async_scheduling.py cover the default mode (int4 on CPU,
semgate's attention kernel) in depth; these cover the other two, int4 over the torch
attention backend (SDPA: the fallback where semgate's kernels cannot run, whose row
invariance rests on padding rules), and int4 over a float32 KV cache (kv_cache_dtype;
the default on CPU is bfloat16)."""

from __future__ import annotations

import pytest

from tests.engine.conftest import GREEDY_32
from tests.engine.prompts import PROMPTS
from tests.engine.test_speculative import GREEDY, MIXED

pytestmark = pytest.mark.slow  # each prompt runs alone first, in two slower weight modes

BATCH = PROMPTS[4:12]  # 6 to 17 tokens; the last one fills a KV block


@pytest.fixture(
    scope="module",
    params=[
        {"quantization": None},
        {"quantization": "int8"},
        {"quantization": "int4", "attention_backend": "torch"},
        {"quantization": "int4", "kv_cache_dtype": "float32"},
    ],
    ids=["float32", "int8", "int4-sdpa", "int4-f32-kv"],
)
def mode(request) -> dict[str, object]:
    return request.param


@pytest.fixture(scope="module")
def alone(make_llm, mode) -> list[list[int]]:
    llm = make_llm(**mode, prefix_caching=False)
    return [llm.generate(p, GREEDY_32)[0].token_ids for p in BATCH]


def test_batched_and_chunked_equal_alone(make_llm, mode, alone):
    llm = make_llm(**mode, prefix_caching=False)
    assert [o.token_ids for o in llm.generate(BATCH, GREEDY_32)] == alone
    chunked = make_llm(**mode, max_num_batched_tokens=24, max_num_seqs=16)
    assert [o.token_ids for o in chunked.generate(BATCH, GREEDY_32)] == alone


def test_a_prefix_cache_hit_keeps_the_output(make_llm, mode, alone):
    llm = make_llm(**mode, max_num_batched_tokens=24, max_num_seqs=16)
    first = llm.generate(BATCH[-1], GREEDY_32)[0]
    again = llm.generate(BATCH[-1], GREEDY_32)[0]
    assert again.num_cached_tokens >= 16
    assert first.token_ids == again.token_ids == alone[-1]


def test_speculation_is_lossless(make_llm, mode):
    reference = make_llm(**mode, prefix_caching=False).generate(MIXED, GREEDY)
    spec = make_llm(**mode, spec_method="ngram", num_spec_tokens=5)
    assert [o.token_ids for o in spec.generate(MIXED, GREEDY)] == [o.token_ids for o in reference]
    assert spec.engine.stats.spec_accepted_tokens > 0


def test_async_scheduling_keeps_the_output(make_llm, mode, alone):
    # tests/engine/test_async_scheduling.py covers each stop condition in the default mode.
    llm = make_llm(**mode, max_num_batched_tokens=24, max_num_seqs=16, async_scheduling=True)
    assert llm.engine.async_steps is not None
    assert [o.token_ids for o in llm.generate(BATCH, GREEDY_32)] == alone
