"""The benchmark's ShareGPT workload, read from the installed dataset package."""

from __future__ import annotations

from bench.sharegpt import MIN_LEN, sample_requests, token_stream


def test_sampled_requests_respect_the_length_caps(llm):
    requests = sample_requests(llm.tokenizer, 12, max_prompt_len=128, max_output_len=24)
    assert len(requests) == 12
    assert len({prompt for prompt, _ in requests}) == 12  # distinct conversations
    for prompt, output_len in requests:
        assert MIN_LEN <= len(llm.tokenizer.encode(prompt)) <= 128
        assert MIN_LEN <= output_len <= 24
    # Deterministic: the same file order every time.
    assert sample_requests(llm.tokenizer, 12, 128, 24) == requests


def test_token_stream_gives_exactly_the_tokens_asked(llm):
    ids = token_stream(llm.tokenizer, 2000)
    assert len(ids) == 2000
    assert len(set(ids)) > 300  # real, varied text
