"""Our engine against Hugging Face transformers on the same GGUF, in float32."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from tests.engine.conftest import first_step_logits
from tests.engine.prompts import PROMPTS

pytestmark = pytest.mark.slow  # loads transformers' own model


def test_tokenizer_matches_transformers(llm, hf_reference):
    _, hf_tok = hf_reference
    texts = [
        *PROMPTS,
        "naïve café \u2013 12345 日本語 🙂",
        "  leading spaces\n\n\ttabs",
        "It's they're 3.14",
    ]
    for text in texts:
        assert llm.tokenizer.encode(text) == hf_tok(text).input_ids, text
        ids = llm.tokenizer.encode(text)
        assert llm.tokenizer.decode(ids, skip_special_tokens=False) == hf_tok.decode(ids)


def test_chat_template_matches_transformers(llm, hf_reference):
    _, hf_tok = hf_reference
    conversations = [
        [{"role": "user", "content": "Hi"}],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"},
        ],
    ]
    for messages in conversations:
        ours = llm.tokenizer.apply_chat_template(messages)
        theirs = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours == theirs


def test_first_step_logits_match_transformers(float32_llm, hf_reference):
    llm = float32_llm
    model, _ = hf_reference
    for prompt in PROMPTS:
        ids = llm.tokenizer.encode(prompt)
        with torch.inference_mode():
            ref = model(torch.tensor([ids])).logits[0, -1].float()
        ours = first_step_logits(llm.engine, ids)
        assert torch.allclose(ours, ref, atol=1e-3, rtol=0), (prompt, (ours - ref).abs().max())


def test_greedy_continuations_match_transformers(float32_llm, hf_reference):
    """Every prompt's 64 greedy tokens, or up to its EOS. transformers runs all prompts
    as one left-padded batch (its attention mask hides the padding; the tokens are the
    same as one prompt at a time, which takes 8x longer) and pads a finished row after
    its EOS."""
    llm = float32_llm
    model, _ = hf_reference
    params = SamplingParams(max_tokens=64, temperature=0.0)
    token_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    outputs = llm.generate(token_ids, params)
    width = max(len(ids) for ids in token_ids)
    pad = model.generation_config.pad_token_id or 0
    inputs = torch.tensor([[pad] * (width - len(ids)) + ids for ids in token_ids])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in token_ids])
    with torch.inference_mode():
        generated = model.generate(
            inputs, attention_mask=mask, max_new_tokens=64, do_sample=False, pad_token_id=pad
        )
    eos = llm.tokenizer.eos_token_ids
    for ids, out, row in zip(token_ids, outputs, generated[:, width:].tolist(), strict=True):
        ends = [i for i, token in enumerate(row) if token in eos]
        expected = row[: ends[0] + 1] if ends else row
        assert out.token_ids == expected, llm.tokenizer.decode(ids)
