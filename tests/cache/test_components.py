"""Policy, thresholds, the embedder and the embedded server's errors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from cache import CachePolicy, CompletionOutcome, EmbeddedRedis, Embedder, Thresholds
from cache import redis_server as redis_server_module
from cache.embedder import EmbedderBusy
from cache.multilingual_embedder import MultilingualEmbedder
from cache.policy import context_fingerprint, normalize_prompt, unkeyable
from cache.thresholds import distance_from_similarity, similarity_from_distance
from tests.cache.fixtures import Run, ask
from tests.waiting import until


def test_policy_bypasses_and_store_rules():
    policy = CachePolicy(max_temperature=0.5)
    assert policy.may_lookup(ask("hi there", "t")) is None
    assert "n > 1" in policy.may_lookup(ask("hi there", "t", fields={"n": 2})).detail
    assert policy.may_lookup(ask("hi there", "t", fields={"n": 1})) is None
    assert policy.may_lookup(ask("hi there", "t", fields={"logprobs": True})).reason == "logprobs"
    tools = {"tools": [{"type": "function"}]}
    assert policy.may_lookup(ask("hi there", "t", fields=tools)).reason == "tools"
    assert "temperature" in policy.may_lookup(ask("hi there", "t", temperature=0.9)).detail
    req = ask("hi there", "t")
    assert policy.may_store(req, CompletionOutcome("hello", "stop")) is None
    for outcome in [
        CompletionOutcome("hel", "length"),
        CompletionOutcome("", "tool_calls"),
        CompletionOutcome("   ", "stop"),
    ]:
        assert policy.may_store(req, outcome) is not None


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "42"}]}, "tool_messages"),
        ({"messages": [{"role": "assistant", "tool_calls": [{}]}]}, "tool_messages"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"top_logprobs": 2}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"top_k": 40}, "top_k"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "non_text_content"),
        ({"kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params"),
        # The first that applies is the reason.
        ({"top_k": 40, "tools": [{}]}, "tools"),
    ],
)
def test_policy_names_the_first_field_it_cannot_key(fields: dict, reason: str):
    assert unkeyable(fields).reason == reason


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1, "top_k": -1, "repetition_penalty": 1, "presence_penalty": 0, "min_p": 0},
        {"tool_choice": "none", "response_format": {"type": "text"}, "logprobs": False},
        {"n": None, "tools": None, "user": "u-1", "seed": 3},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]},
    ],
)
def test_neutral_values_are_keyed_as_usual(fields: dict):
    assert unkeyable(fields) is None


def test_an_unknown_field_bypasses_once_nothing_else_does():
    assert unkeyable({}, "reasoning_effort").reason == "unknown_field"
    assert unkeyable({"n": 2}, "reasoning_effort").reason == "n"


def test_context_fingerprint_covers_model_system_and_turns():
    sys_a = [{"role": "system", "content": "be brief"}]
    sys_b = [{"role": "system", "content": "be verbose"}]
    assert context_fingerprint("m", sys_a) == context_fingerprint("m", list(sys_a))
    assert context_fingerprint("m", sys_a) != context_fingerprint("m", sys_b)
    assert context_fingerprint("m", sys_a) != context_fingerprint("n", sys_a)
    assert normalize_prompt("  What  is X? ") == normalize_prompt("what is x")


def test_thresholds_are_similarities_with_overrides():
    t = Thresholds(default=0.8, per_model={"big": 0.9}, per_tenant={"strict": 0.95})
    assert t.for_scope("anyone", "small") == 0.8
    assert t.for_scope("anyone", "big") == 0.9
    assert t.for_scope("strict", "big") == 0.95
    assert distance_from_similarity(0.83) == pytest.approx(0.17)  # redisvl's cosine distance
    assert similarity_from_distance(0.17) == pytest.approx(0.83)
    bad: Any  # of the wrong type too: refused at run time
    for bad in (1.5, -0.1, "0.8", True):
        with pytest.raises(ValueError):
            Thresholds(default=bad)


def test_embedder_matches_sentence_transformers_and_batches(embedder: Embedder, run: Run):
    from sentence_transformers import SentenceTransformer

    from cache.embedder import resolve_embedder_path

    texts = ["How do I reset my password?", "Convert 100 °F to Celsius", "hi", "word " * 400]
    reference = SentenceTransformer(
        str(resolve_embedder_path("all-minilm-l6-v2")[1]), device="cpu"
    ).encode(texts, normalize_embeddings=True)
    exact = Embedder(dtype="float32")
    try:
        assert np.all(np.sum(exact.encode(texts) * reference, axis=1) > 0.999)
    finally:
        exact.close()
    ours = embedder.encode(texts)  # int8 by default: close, under its own model id
    assert ours.shape == (4, embedder.dims) and ours.dtype == np.float32
    assert np.all(np.sum(ours * reference, axis=1) > 0.92)
    assert embedder.model_id == "all-minilm-l6-v2-int8"

    async def concurrent() -> list[np.ndarray]:
        return await asyncio.gather(*(embedder.embed(t) for t in texts * 8))

    batched = run(concurrent())
    for i, vec in enumerate(batched):
        assert float(np.dot(vec, ours[i % 4])) > 0.9999


def test_embedder_vectors_do_not_depend_on_load(
    embedder: Embedder, run: Run, monkeypatch: pytest.MonkeyPatch
):
    """int8 quantises a layer's whole input with one scale, so each text is encoded alone:
    its vector is the same among concurrent callers as alone, and a text several callers
    ask for at once is encoded once."""
    tag = uuid.uuid4().hex  # texts no earlier test left in the LRU
    questions = ["How do I reset my password?", "Convert 100 °F to Celsius", "hi", "word " * 40]
    texts = [f"{q} {tag}" for q in questions]
    alone = [embedder.encode([t])[0] for t in texts]
    encoded: list[str] = []
    encode = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda batch: encoded.extend(batch) or encode(batch))

    async def crowd() -> list[np.ndarray]:
        return await asyncio.gather(*(embedder.embed(t) for t in texts * 8))

    for i, vec in enumerate(run(crowd())):
        assert np.array_equal(vec, alone[i % 4])
    assert sorted(encoded) == sorted(texts)


def test_embedder_outlives_callers_that_give_up(embedder: Embedder, run: Run):
    """A caller cancelled while its text waits (a lookup past its timeout) is dropped and
    the workers carry on (answering its cancelled future used to end the worker)."""
    tag = uuid.uuid4().hex

    async def give_up() -> np.ndarray:
        waits = [
            asyncio.ensure_future(embedder.embed(f"{tag} question {i} " * 5)) for i in range(40)
        ]
        await asyncio.sleep(0)  # each caller has queued its text (submit is synchronous)
        for wait in waits[2:]:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        return await asyncio.wait_for(embedder.embed(f"{tag} and after them"), 10)

    assert run(give_up()).shape == (embedder.dims,)


def long_texts(tag: str, n: int) -> list[str]:
    """n texts past the embedder's 256-token window (each ~35 ms to embed on one core)."""
    return [f"{tag} {i} " + " ".join(f"word{j} lorem ipsum" for j in range(150)) for i in range(n)]


@pytest.mark.parametrize("which", ["english", "multilingual"])
def test_a_bounded_wait_is_refused_past_the_queue_but_joins_a_text_already_queued(
    embedder: Embedder, multilingual: MultilingualEmbedder, run: Run, which: str
):
    emb = embedder if which == "english" else multilingual
    tag = uuid.uuid4().hex
    texts = long_texts(tag, 40)

    async def crowd() -> tuple[np.ndarray, np.ndarray]:
        waits = [asyncio.ensure_future(emb.embed(text)) for text in texts]
        await asyncio.sleep(0)  # each has queued its text (submit is synchronous)
        with pytest.raises(EmbedderBusy, match="texts queued"):
            await emb.embed(f"{tag} one more", queue_limit=10)
        joined = await emb.embed(texts[-1], queue_limit=0)  # queued already: no new work
        await asyncio.gather(*waits)
        return joined, await emb.embed(f"{tag} one more", queue_limit=10)  # drained

    joined, after = run(crowd())
    assert joined.shape == after.shape == (emb.dims,)


def test_unknown_embedder_is_a_clear_error():
    with pytest.raises(ValueError, match="never downloaded"):
        Embedder("sentence-transformers/not-here")


def test_missing_libssl_names_the_bootstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(redis_server_module, "LIBSSL_DIR", tmp_path / "nope")
    with pytest.raises(redis_server_module.RedisUnavailableError, match="bootstrap"):
        EmbeddedRedis(tmp_path / "data").start()


def test_one_server_per_data_dir(redis_server: EmbeddedRedis):
    with pytest.raises(redis_server_module.RedisUnavailableError, match="REDIS_URL"):
        EmbeddedRedis(redis_server.data_dir).start()
    assert redis_server.running


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie nobody has reaped yet has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_embedded_redis_dies_with_the_process_that_started_it(tmp_path: Path):
    """Killed without a chance to stop it (SIGKILL), the owner leaves no Redis behind."""
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from cache import EmbeddedRedis; "
         "server = EmbeddedRedis(sys.argv[1]); server.start(); print(server.pid, flush=True); "
         "time.sleep(60)", str(tmp_path / "data")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert _alive(pid)
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    until("the orphaned Redis exits", lambda: not _alive(pid))


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_redis_url_without_search_module_is_refused(tmp_path: Path):
    """A plain Redis (the same binary, no modules loaded) is not enough for the cache."""
    port = redis_server_module.free_port()
    proc = subprocess.Popen(
        [str(redis_server_module.redis_stack_dir() / "bin" / "redis-server"),
         "--port", str(port), "--save", "", "--dir", str(tmp_path)],
        env={"LD_LIBRARY_PATH": str(redis_server_module.LIBSSL_DIR)},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port)
        until("it answers", lambda: _pings(client))
        with pytest.raises(redis_server_module.RedisUnavailableError, match="search module"):
            redis_server_module.check_redis_url(f"redis://127.0.0.1:{port}/0")
    finally:
        proc.terminate()
        proc.wait()
