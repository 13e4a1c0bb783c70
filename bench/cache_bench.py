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
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.report import met_cell, summary_ms, write_report
from cache import CacheRuntime, SemanticCache
from cache.policy import CacheRequest
from cache.thresholds import DEFAULT_THRESHOLD, distance_from_similarity

console = Console(stderr=True)

SINGLE_P50_GOAL_MS = 10.0
RATE_GOAL_PER_S = 300.0
CALLERS = 32


# Chat and support questions are short: first turns of at most this many characters
# (about 8-40 tokens). Embedding cost grows with length; the report states the mean.
MAX_CHARS = 160


def _prompts(n: int) -> list[str]:
    from bench.sharegpt import first_exchanges

    seen: dict[str, None] = {}
    for prompt, _ in first_exchanges():
        text = prompt.strip()
        if 20 <= len(text) <= MAX_CHARS and text not in seen:
            seen[text] = None
            if len(seen) == n:
                break
    return list(seen)


async def _semgate_lookup(cache: SemanticCache, question: str) -> None:
    request = CacheRequest(
        model="bench", messages=[{"role": "user", "content": question}], temperature=0.0
    )
    result = await cache.lookup(request)
    if result.status == "error":  # a failed-open lookup is fast and would flatter us
        raise RuntimeError(f"a benchmark lookup failed: {result.reason}")


async def _semgate_single(cache: SemanticCache, queries: list[str]) -> list[float]:
    times = []
    for q in queries:
        t = time.perf_counter()
        await _semgate_lookup(cache, q)
        times.append(time.perf_counter() - t)
    return times


async def _lookups_per_s(lookup: Callable[[str], Awaitable[object]], queries: list[str]) -> float:
    """CALLERS concurrent callers drain the queries; lookups per second."""
    pending = list(queries)

    async def caller() -> None:
        while pending:
            await lookup(pending.pop())

    t = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(CALLERS)))
    return len(queries) / (time.perf_counter() - t)


def _redisvl_single(reference: Any, queries: list[str]) -> list[float]:
    times = []
    for q in queries:
        t = time.perf_counter()
        reference.check(prompt=q)
        times.append(time.perf_counter() - t)
    return times


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
            ours_rate.append(await _lookups_per_s(lambda q: _semgate_lookup(cache, q), c))
            ref_rate.append(await _lookups_per_s(lambda q: reference.acheck(prompt=q), d))
        await asyncio.to_thread(reference.delete)
        await cache.store.flush(model="bench")
    return {
        "entries": n_entries,
        "query_mean_tokens": mean_tokens,
        "single": {"semgate": summary_ms(ours_single), "redisvl": summary_ms(ref_single)},
        "concurrent_callers": CALLERS,
        "lookups_per_s": {
            "semgate": statistics.median(ours_rate),
            "redisvl": statistics.median(ref_rate),
        },
        "goals": {
            "single_p50_ms_under": SINGLE_P50_GOAL_MS,
            "lookups_per_s_at_least": RATE_GOAL_PER_S,
        },
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
    ours, ref = result["single"]["semgate"], result["single"]["redisvl"]
    rate = result["lookups_per_s"]
    table.add_row(
        "single lookup p50",
        f"{ours['p50_ms']:.2f} ms",
        f"{ref['p50_ms']:.2f} ms",
        f"< {SINGLE_P50_GOAL_MS:g} ms",
        met_cell(ours["p50_ms"] < SINGLE_P50_GOAL_MS),
    )
    table.add_row(
        "single lookup p99", f"{ours['p99_ms']:.2f} ms", f"{ref['p99_ms']:.2f} ms", "", ""
    )
    table.add_row(
        f"{CALLERS} concurrent callers",
        f"{rate['semgate']:.0f} /s",
        f"{rate['redisvl']:.0f} /s",
        f">= {RATE_GOAL_PER_S:g} /s",
        met_cell(rate["semgate"] >= RATE_GOAL_PER_S),
    )
    out = Console()
    out.print(table)
    out.print(
        f"{result['entries']} entries; queries average "
        f"{result['query_mean_tokens']:.1f} embedder tokens"
    )
    write_report(out_path, result)
    return result
