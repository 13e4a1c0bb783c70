"""POST /v1/embeddings: the bundled embedder in OpenAI's shape, through the openai SDK."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from cache import Embedder
from tests.gateway import fake_upstream
from tests.gateway.fake_upstream import EMBEDDING, FakeUpstream
from tests.gateway.servers import Server

QUESTIONS = ["How do I reset my password?", "I forgot my password, how can I change it?",
             "What is the boiling point of water?"]  # fmt: skip


def test_vectors_are_the_bundled_embedders(alice: openai.OpenAI, embedder: Embedder):
    local = embedder  # the same bundled embedder, in the test process
    # The SDK asks for base64 and decodes it; the float form must say the same.
    result = alice.embeddings.create(model="all-MiniLM-L6-v2", input=QUESTIONS)
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert [d.index for d in result.data] == [0, 1, 2]
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got, local.embed_many(QUESTIONS), atol=1e-5)
    assert np.linalg.norm(got, axis=1) == pytest.approx(1, abs=1e-4)
    assert got[0] @ got[1] > got[0] @ got[2] + 0.3  # paraphrases close, others not
    assert result.model == local.model_id  # the bundled model, named with its weights' form
    again = alice.embeddings.create(model=local.model_id, input=QUESTIONS[0])
    np.testing.assert_array_equal(again.data[0].embedding, got[0])
    tokens = sum(local.num_tokens(q) for q in QUESTIONS)
    assert (result.usage.prompt_tokens, result.usage.total_tokens) == (tokens, tokens)


def test_float_and_base64_encodings_agree(http: httpx.Client):
    body = {"model": "sentence-transformers/all-MiniLM-L6-v2", "input": QUESTIONS[0]}
    floats = http.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    encoded = http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    vector = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(vector, np.array(floats["data"][0]["embedding"], "<f4"))


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        ({"model": "text-embedding-3-small", "input": "hi"}, 404, "model", "does not exist"),
        # Empty input: the schema says so (minLength, minItems), decoding refuses it.
        ({"model": "all-minilm-l6-v2", "input": ""}, 400, "input", "length >= 1"),
        ({"model": "all-minilm-l6-v2", "input": []}, 400, "input", "length >= 1"),
        ({"model": "all-minilm-l6-v2", "input": ["a", ""]}, 400, "input[1]", "length >= 1"),
        ({"model": "all-minilm-l6-v2", "input": [[1, 2]]}, 400, "input", "token ids"),
        ({"model": "all-minilm-l6-v2", "input": "word " * 300}, 400, "input", "over the model's"),
        ({"model": "all-minilm-l6-v2", "input": "hi", "dimensions": 128}, 400, "dimensions",
         "384-dimensional"),
        ({"model": "all-minilm-l6-v2", "input": ["x"] * 2049}, 400, "input", "length <= 2048"),
        ({"model": "all-minilm-l6-v2", "input": 5}, 400, "input", "Expected"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(http: httpx.Client, body, status, param, says):
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_embeddings_need_an_api_key(gateway):
    response = httpx.post(gateway.url + "/v1/embeddings", json={"model": "x", "input": "hi"})
    assert response.status_code == 401


def test_a_gateway_without_the_cache_loads_the_embedder_on_first_use(engine_server):
    body = {"model": "all-MiniLM-L6-v2", "input": QUESTIONS[2]}
    response = httpx.post(engine_server.url + "/v1/embeddings", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == 384


def test_other_models_are_forwarded_to_the_upstreams_that_serve_them(
    fake_front: Server, fake: FakeUpstream
):
    client = openai.OpenAI(base_url=fake_front.url + "/v1", api_key="unused", max_retries=0)
    received = len(fake.bodies)
    sent = {"model": fake_upstream.MODEL, "input": ["one", "two"], "encoding_format": "float"}
    raw = client.embeddings.with_raw_response.create(**sent, extra_body={"user": "u-7"})
    assert fake.bodies[-1] == {**sent, "user": "u-7"}  # as it came
    assert [d.embedding for d in raw.parse().data] == [EMBEDDING, EMBEDDING]
    assert raw.headers["x-cache-bypass-reason"] == "embeddings"
    local = client.embeddings.create(model="all-MiniLM-L6-v2", input="three")
    assert len(local.data[0].embedding) == 384 and len(fake.bodies) == received + 1
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.embeddings.create(model="text-embedding-3-small", input="four")
