"""Loading: the GGUF's own metadata, and a Hugging Face directory of the same model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from engine import LLM, EngineConfig
from engine.config import resolve_model_path
from engine.loader import TORCH_DEQUANTIZERS
from tests.engine.conftest import GREEDY_32, hf_reference_dir, save_hf_directory
from tests.engine.prompts import PROMPTS


def test_bundled_model_resolves_to_the_packaged_gguf():
    path = resolve_model_path("smollm2-135m-instruct")
    assert path.name.endswith(".gguf") and path.is_file()
    assert resolve_model_path(str(path)) == path


def test_model_config_comes_from_gguf_metadata(llm):
    cfg = llm.engine.model_config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.vocab_size == 49152 and cfg.rope_theta == 100000.0
    assert llm.tokenizer.eos_token_ids == {2}
    assert "<|im_start|>" in (llm.tokenizer.chat_template or "")


@pytest.fixture(scope="module")
def hf_dir(hf_reference, tmp_path_factory):
    """The same model saved from transformers as config.json + safetensors + tokenizer.json
    (the reference fixture keeps that directory, unless the cache cannot be written)."""
    where = hf_reference_dir()
    if not where.is_dir():
        where = tmp_path_factory.mktemp("smollm2") / "hf"
        save_hf_directory(*hf_reference, where)
    return where


@pytest.mark.slow  # transformers' own model (the session's reference) saved as a directory
def test_hugging_face_directory_gives_the_same_outputs(hf_dir, llm):
    hf_llm = LLM(EngineConfig(model=str(hf_dir), max_model_len=1024, kv_cache_memory=1 << 27))
    assert hf_llm.engine.model_config == llm.engine.model_config
    assert hf_llm.tokenizer.encode(PROMPTS[2]) == llm.tokenizer.encode(PROMPTS[2])
    ours = [o.token_ids for o in llm.generate(PROMPTS[:4], GREEDY_32)]
    theirs = [o.token_ids for o in hf_llm.generate(PROMPTS[:4], GREEDY_32)]
    assert theirs == ours
    messages = [{"role": "user", "content": "Hi"}]
    assert hf_llm.tokenizer.apply_chat_template(messages) == llm.tokenizer.apply_chat_template(
        messages
    )


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_torch_dequantization_equals_gguf(kind):
    qtype = GGMLQuantizationType[kind]
    weights = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    blocks = quantize(weights, qtype)
    ours = TORCH_DEQUANTIZERS[qtype](torch.from_numpy(blocks.copy()))
    theirs = torch.from_numpy(np.ascontiguousarray(dequantize(blocks, qtype)))
    assert torch.equal(ours.reshape(theirs.shape), theirs)


def test_engines_share_a_loaded_model_only_where_it_builds_the_same_weights(llm):
    twin = LLM(EngineConfig(max_num_seqs=2, num_kv_blocks=512), llm.engine.loaded)
    assert twin.engine.model is llm.engine.model
    expected = llm.generate(PROMPTS[0], GREEDY_32)[0].token_ids
    assert twin.generate(PROMPTS[0], GREEDY_32)[0].token_ids == expected
    with pytest.raises(ValueError, match="built for"):
        LLM(EngineConfig(quantization="int8"), llm.engine.loaded)
