"""`semgate bench cache`: lookup latency and throughput, against redisvl's SemanticCache.

It lives in the gateway package because it draws prompts from the engine's
ShareGPT reader, and the cache package never imports the engine.

Both sides use the same embedded Redis Stack, the same embedding model and the
same seeded entries (first user turns from ShareGPT). Lookups use texts the
embedders have not seen, so no LRU hides the embedding cost. Rounds alternate
semgate and redisvl; medians are reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cache.policy import CacheRequest
from cache.semantic_cache import CacheRuntime, SemanticCache
from cache.thresholds import DEFAULT_THRESHOLD, distance_from_similarity

console = Console(stderr=True)


# Chat and support questions are short: first turns of at most this many characters
# (about 8-40 tokens). Embedding cost grows with length; the report states the mean.
MAX_CHARS = 160


def _prompts(n: int) -> list[str]:
    from engine.bench.sharegpt import iter_conversations

    seen: dict[str, None] = {}
    for turns in iter_conversations():
        text = (turns[0].get("value") or "").strip() if turns else ""
        if 20 <= len(text) <= MAX_CHARS and text not in seen:
            seen[text] = None
            if len(seen) == n:
                break
    return list(seen)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _semgate_single(cache: SemanticCache, queries: list[str]) -> list[float]:
    times = []
    for q in queries:
        request = CacheRequest(
            model="bench", messages=[{"role": "user", "content": q}], temperature=0.0
        )
        t = time.perf_counter()
        result = await cache.lookup(request)
        times.append(time.perf_counter() - t)
        if result.status == "error":
            raise RuntimeError(f"a benchmark lookup failed: {result.reason}")
    return times


async def _semgate_concurrent(cache: SemanticCache, queries: list[str], callers: int) -> float:
    pending = list(queries)

    async def caller() -> None:
        while pending:
            q = pending.pop()
            await cache.lookup(
                CacheRequest(
                    model="bench", temperature=0.0, messages=[{"role": "user", "content": q}]
                )
            )

    t = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return len(queries) / (time.perf_counter() - t)


def _redisvl_single(reference: Any, queries: list[str]) -> list[float]:
    times = []
    for q in queries:
        t = time.perf_counter()
        reference.check(prompt=q)
        times.append(time.perf_counter() - t)
    return times


async def _redisvl_concurrent(reference: Any, queries: list[str], callers: int) -> float:
    pending = list(queries)

    async def caller() -> None:
        while pending:
            await reference.acheck(prompt=pending.pop())

    t = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return len(queries) / (time.perf_counter() - t)


def _reference_cache(url: str, entries: list[str]) -> Any:
    from redisvl.extensions.cache.llm import SemanticCache as RedisVLCache
    from redisvl.utils.vectorize import HFTextVectorizer

    from cache.embedder import resolve_embedder_path

    vectorizer = HFTextVectorizer(model=str(resolve_embedder_path("all-minilm-l6-v2")[1]))
    reference = RedisVLCache(
        name="redisvl-bench",
        redis_url=url,
        vectorizer=vectorizer,
        distance_threshold=distance_from_similarity(DEFAULT_THRESHOLD),
        overwrite=True,
    )
    for text in entries:
        reference.store(prompt=text, response="(cached answer)")
    return reference


async def _bench(quick: bool) -> dict[str, Any]:
    n_entries, n_single, n_conc, rounds = (200, 40, 256, 2) if quick else (1000, 200, 1024, 3)
    callers = 32
    texts = _prompts(n_entries + rounds * 2 * (n_single + n_conc))
    entries, rest = texts[:n_entries], texts[n_entries:]
    logging.getLogger("redisvl").setLevel(logging.ERROR)
    async with CacheRuntime() as cache:
        mean_tokens = statistics.mean(len(cache.embedder.tokenizer(t)["input_ids"]) for t in rest)
        with console.status(f"seeding {n_entries} entries on both sides ..."):
            cache.embedder.embed_many(entries)
            for text in entries:
                await cache.seed(text, "(cached answer)", model="bench")
            reference = await asyncio.to_thread(_reference_cache, cache.store.url, entries)
        ours_single: list[float] = []
        ref_single: list[float] = []
        ours_rate: list[float] = []
        ref_rate: list[float] = []
        for r in range(rounds):
            console.print(f"round {r + 1}/{rounds}")
            chunk = rest[r * 2 * (n_single + n_conc) : (r + 1) * 2 * (n_single + n_conc)]
            a, b = chunk[:n_single], chunk[n_single : 2 * n_single]
            c, d = chunk[2 * n_single : 2 * n_single + n_conc], chunk[2 * n_single + n_conc :]
            ours_single += await _semgate_single(cache, a)
            ref_single += await asyncio.to_thread(_redisvl_single, reference, b)
            ours_rate.append(await _semgate_concurrent(cache, c, callers))
            ref_rate.append(await _redisvl_concurrent(reference, d, callers))
        await asyncio.to_thread(reference.delete)
        await cache.store.flush(model="bench")
    return {
        "entries": n_entries,
        "query_mean_tokens": mean_tokens,
        "single_p50_ms": {
            "semgate": 1e3 * statistics.median(ours_single),
            "redisvl": 1e3 * statistics.median(ref_single),
        },
        "single_p99_ms": {
            "semgate": 1e3 * _pct(ours_single, 0.99),
            "redisvl": 1e3 * _pct(ref_single, 0.99),
        },
        "concurrent_callers": callers,
        "lookups_per_s": {
            "semgate": statistics.median(ours_rate),
            "redisvl": statistics.median(ref_rate),
        },
        "goals": {"single_p50_ms_under": 10.0, "lookups_per_s_at_least": 300.0},
    }


def run_cache_bench(quick: bool = False, out_path: Path | None = None) -> dict[str, Any]:
    result = asyncio.run(_bench(quick))
    table = Table(
        "measure",
        "semgate",
        "redisvl SemanticCache",
        "goal",
        "met",
        title="cache lookup (embed + exact + semantic + guard)",
    )
    p50 = result["single_p50_ms"]
    rate = result["lookups_per_s"]
    table.add_row(
        "single lookup p50",
        f"{p50['semgate']:.2f} ms",
        f"{p50['redisvl']:.2f} ms",
        "< 10 ms",
        "yes" if p50["semgate"] < 10 else "no",
    )
    table.add_row(
        "single lookup p99",
        f"{result['single_p99_ms']['semgate']:.2f} ms",
        f"{result['single_p99_ms']['redisvl']:.2f} ms",
        "",
        "",
    )
    table.add_row(
        "32 concurrent callers",
        f"{rate['semgate']:.0f} /s",
        f"{rate['redisvl']:.0f} /s",
        ">= 300 /s",
        "yes" if rate["semgate"] >= 300 else "no",
    )
    Console().print(table)
    Console().print(
        f"{result['entries']} entries; queries average "
        f"{result['query_mean_tokens']:.1f} embedder tokens"
    )
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2))
    return result
