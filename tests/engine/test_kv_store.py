"""The KV store in Redis (engine/redis_kv_store.py) against the session's real Redis
Stack: a prompt one engine computed is loaded by a fresh one (another replica, or the
same server restarted) with the same greedy text; tenants never share; a store that is
down, hangs, or holds bad values costs time, never a wrong token."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import redis

from cache.redis_server import EmbeddedRedis
from engine import AsyncLLM, SamplingParams
from engine.config import EngineConfig
from engine.kv_block_codec import HEADER, KVLayout, check_block, encode_block
from engine.kv_cache import prompt_block_hashes
from engine.llm import LLM
from engine.loaded_model import LoadedModel
from engine.outputs import RequestOutput
from engine.redis_kv_store import RedisKVStore

KV_DB = 5  # the session's Redis, a database of the KV store's own
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
# About 420 tokens: 26 full blocks of 16, and a partial one computed by every engine.
PROMPT = "Inventory: " + " ".join(f"crate {i} holds {i * 7 % 97} apples;" for i in range(60))


@pytest.fixture(scope="module")
def store_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    url = redis_server.url.rsplit("/", 1)[0] + f"/{KV_DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()


@pytest.fixture(scope="module")
def model(llm: LLM) -> LoadedModel:
    return llm.engine.loaded  # the session's weights: engines of one model key share them


@pytest.fixture
def engine(model: LoadedModel, store_url: str) -> Iterator[Callable[..., LLM]]:
    """Fresh engines (a new server each: nothing in its own prefix cache) on the store;
    the store is emptied first, and each engine's threads stopped after."""
    redis.Redis.from_url(store_url).flushdb()
    made: list[LLM] = []

    def make(**overrides: object) -> LLM:
        # Room for one request of the model's whole context (8,192 tokens), no more.
        settings = {"kv_cache_memory": 200 << 20, "kv_store": store_url, **overrides}
        llm = LLM(EngineConfig(**settings), model)  # type: ignore[arg-type]
        made.append(llm)
        return llm

    yield make
    for llm in made:
        llm.close()


def answer(
    llm: LLM,
    salt: str | None = None,
    params: SamplingParams = GREEDY,
    prompt: str = PROMPT,
    **kv: object,
) -> RequestOutput:
    rid = llm.add_request(prompt, params, cache_salt=salt, kv_transfer_params=kv or None)
    while True:
        for out in llm.step():
            if out.request_id == rid and out.finished:
                return out


def test_a_fresh_engine_loads_what_another_computed(engine: Callable[..., LLM]) -> None:
    first = answer(engine())
    assert first.metrics.num_loaded_tokens == 0
    second_engine = engine()
    second = answer(second_engine)
    prompt_len = len(second.prompt_token_ids)
    assert second.token_ids == first.token_ids
    # Every full block short of the last token: all but the partial tail.
    assert second.metrics.num_loaded_tokens == (prompt_len - 1) // 16 * 16
    assert second.num_cached_tokens == second.metrics.num_loaded_tokens
    stats = second_engine.engine.get_stats().kv_transfer
    assert stats is not None and stats.loaded_tokens == second.metrics.num_loaded_tokens
    assert stats.load_seconds.counts and sum(stats.load_seconds.counts) == 1


def test_another_tenant_loads_nothing(engine: Callable[..., LLM]) -> None:
    answer(engine(), salt="tenant-a")
    other = answer(engine(), salt="tenant-b")
    same = answer(engine(), salt="tenant-a")
    assert other.metrics.num_loaded_tokens == 0
    assert same.metrics.num_loaded_tokens > 0


def flip_a_payload_bit(value: bytes) -> bytes:
    at = HEADER.size + 100
    return value[:at] + bytes([value[at] ^ 1]) + value[at + 1 :]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda v: v[:-1000], "truncated"),
        (flip_a_payload_bit, "checksum"),
        (lambda v: b"XXXX" + v[4:], "header"),
    ],
)  # fmt: skip
def test_a_damaged_value_is_recomputed_never_loaded(
    engine: Callable[..., LLM], store_url: str, damage: Callable[[bytes], bytes], reason: str
) -> None:
    first_engine = engine()
    first = answer(first_engine)
    client = redis.Redis.from_url(store_url)
    # Damage the value of the prompt's 5th block: the four before it still load.
    target = block_keys(first_engine)[4]
    value = client.get(target)
    assert isinstance(value, bytes)
    client.set(target, damage(value))
    fresh = engine()
    second = answer(fresh)
    assert second.token_ids == first.token_ids
    assert second.metrics.num_loaded_tokens == 4 * 16
    stats = fresh.engine.get_stats().kv_transfer
    assert stats is not None and stats.failures.get(reason, 0) > 0
    assert client.get(target) != damage(value)  # deleted (and saved again, good)


def block_keys(llm: LLM) -> list[bytes]:
    """The store's keys of PROMPT's full blocks short of its last token, in prompt order,
    as llm names them."""
    connector = llm.engine.kv_connector
    assert isinstance(connector, RedisKVStore)
    seq = llm.engine.make_sequence(PROMPT, GREEDY)
    return [connector.key(h) for h in prompt_block_hashes(seq, 16)]


def test_a_store_that_is_down_costs_only_time(engine: Callable[..., LLM]) -> None:
    expected = answer(engine())
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    down = engine(kv_store=f"redis://127.0.0.1:{port}/0")
    outs = [answer(down) for _ in range(4)]
    assert all(o.token_ids == expected.token_ids for o in outs)
    stats = down.engine.get_stats().kv_transfer
    assert stats is not None and stats.failures.get("unavailable", 0) > 0
    # A prefill whose saves failed names nothing for a decode server to load.
    prefill = engine(kv_store=f"redis://127.0.0.1:{port}/0", kv_role="prefill")
    assert answer(prefill, salt="fresh", do_remote_decode=True).kv_transfer_params is None


def test_a_hung_store_costs_a_short_timeout_then_is_skipped(engine: Callable[..., LLM]) -> None:
    """A server that accepts and never answers: lookups time out until the breaker
    opens, and every answer is still right."""
    expected = answer(engine())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        hung = engine(kv_store=f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
        # Other salts, other blocks: each request asks the store (none is in the local cache).
        outs = [answer(hung, salt=f"tenant-{i}") for i in range(5)]
        assert all(o.token_ids == expected.token_ids for o in outs)
        connector = hung.engine.kv_connector
        assert connector is not None
        stats = connector.stats
        assert stats.failures.get("timeout", 0) > 0
        assert isinstance(connector, RedisKVStore) and connector.breaker.open
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_a_prefill_answer_waits_for_its_save_and_names_it(
    engine: Callable[..., LLM], store_url: str
) -> None:
    colocated = answer(engine())
    redis.Redis.from_url(store_url).flushdb()
    prefill = engine(kv_role="prefill")
    out = answer(prefill, params=replace(GREEDY, max_tokens=1), do_remote_decode=True)
    params = out.kv_transfer_params
    assert params is not None and params["do_remote_prefill"] is True
    prompt_len = len(out.prompt_token_ids)
    assert params["num_saved_tokens"] == prompt_len // 16 * 16
    # Answered once saved: every block it names is in the store already.
    client = redis.Redis.from_url(store_url)
    assert all(client.exists(key) for key in block_keys(prefill))
    decode = engine(kv_role="decode")
    loaded = answer(decode, **params)
    assert loaded.metrics.num_loaded_tokens == (prompt_len - 1) // 16 * 16
    assert loaded.token_ids == colocated.token_ids
    decode_stats = decode.engine.get_stats().kv_transfer
    assert decode_stats is not None and decode_stats.saved_tokens == 0  # decode only loads


def test_an_engine_without_a_store_answers_no_transfer(llm: LLM) -> None:
    out = answer(llm, do_remote_decode=True)
    assert out.kv_transfer_params is None
    assert llm.engine.get_stats().kv_transfer is None


def test_an_abort_while_loading_frees_every_block(engine: Callable[..., LLM]) -> None:
    answer(engine())
    llm = engine()
    rid = llm.add_request(PROMPT, GREEDY)
    llm.step()  # admitted: parked while its blocks load
    assert rid in llm.engine.scheduler.loading
    llm.engine.abort(rid)
    while llm.has_unfinished():
        llm.step()
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_a_value_is_only_good_for_its_own_block_and_layout() -> None:
    layout = KVLayout("m", "bfloat16", "common", 16, 2, 1, 4, 2)
    payload = memoryview(bytes(range(256)) * (layout.block_bytes // 256))
    value = encode_block(layout, b"a" * 32, payload)
    assert check_block(layout, b"a" * 32, value) is None
    assert check_block(layout, b"b" * 32, value) == "header"  # stored under another key
    assert check_block(replace(layout, attention_layout="cpu"), b"a" * 32, value) == "header"
    assert check_block(replace(layout, kv_dtype="float32"), b"a" * 32, value) == "header"
    assert check_block(layout, b"a" * 32, None) == "missing"
    assert check_block(layout, b"a" * 32, value[:10]) == "truncated"


@pytest.mark.slow  # two engine core processes
def test_a_restarted_server_loads_its_prompt_and_answers_a_transfer_once_saved(
    engine: Callable[..., LLM], store_url: str
) -> None:
    """Through the core process (AsyncLLM, as `semgate serve` runs it): a prefill
    answer names what it saved; the server restarted on the same store loads it."""
    expected = answer(engine())
    redis.Redis.from_url(store_url).flushdb()
    config = EngineConfig(kv_cache_memory=200 << 20, kv_store=store_url, num_threads=1)

    async def last(server: AsyncLLM, params: SamplingParams, **kv: object) -> RequestOutput:
        outs = [out async for out in server.generate(PROMPT, params, kv_transfer_params=kv)]
        return outs[-1]

    before = AsyncLLM(config)
    try:
        prefill = asyncio.run(last(before, replace(GREEDY, max_tokens=1), do_remote_decode=True))
    finally:
        before.shutdown()
    assert prefill.kv_transfer_params is not None
    assert prefill.kv_transfer_params["num_saved_tokens"] >= 400
    after = AsyncLLM(config)
    try:
        out = asyncio.run(last(after, GREEDY, **prefill.kv_transfer_params))
        stats = after.get_stats().kv_transfer
    finally:
        after.shutdown()
    assert out.token_ids == expected.token_ids
    assert out.metrics.num_loaded_tokens == (len(out.prompt_token_ids) - 1) // 16 * 16
    assert stats is not None and stats.loaded_tokens == out.metrics.num_loaded_tokens


def test_the_common_layout_round_trips_and_never_mixes_with_the_cpu_kernels(
    engine: Callable[..., LLM],
) -> None:
    """torch's SDPA backend keeps the common layout that flash's does (its CUDA path
    stages the same bytes through pinned memory): it round-trips too, and a CPU-kernel
    engine never loads its blocks."""
    prompt = PROMPT[: len(PROMPT) // 2]  # SDPA prefills slowly on a CPU
    first = answer(engine(attention_backend="torch"), prompt=prompt)
    second = answer(engine(attention_backend="torch"), prompt=prompt)
    assert second.token_ids == first.token_ids
    assert second.metrics.num_loaded_tokens == (len(second.prompt_token_ids) - 1) // 16 * 16
    assert answer(engine(), prompt=prompt).metrics.num_loaded_tokens == 0
