"""`semgate bench gateway`: the gateway end to end over HTTP, against the engine in-process.

One run starts a real `semgate serve` (an engine on one thread, an embedded Redis in a
temporary directory, a fixed admin key) and measures, over one keep-alive
connection with sequential requests:

1. Cache hits. ShareGPT first user turns (like `semgate bench cache`) are seeded
   through the admin API, then asked again as non-streaming greedy chat requests:
   verbatim or with case and trailing punctuation changed (the exact tier), and
   lightly reworded (a polite prefix or suffix: the semantic tier, which embeds
   the question). Rounds alternate the tiers; a sample counts only when the
   response says `X-Cache-Status: Hit` (and, for the exact tier, similarity 1).
2. The gateway's overhead on a miss. An `AsyncLLM` called from this process (its
   engine core a child process, as the server's is), configured like the server's
   engine, answers the same messages as the server, request by request and
   strictly one at a time (the two engines share 2 cores). Each answer
   is one token (`ignore_eos`), so a request costs one prefill: long generations
   would bury a few milliseconds under the engines' step-to-step noise. Every
   prompt is unique so the cache never hits. The HTTP side is either a true miss
   (lookup, generate, store) or `Cache-Control: no-store` (no lookup, no store:
   HTTP and gateway only). The overhead is the median of the paired differences,
   HTTP minus in-process, with a 95% interval; the order of the two sides
   alternates. HTTP framing (client time minus the server's own e2e latency, read
   from /metrics around each request) is reported beside it, and a true miss's cache
   lookup as its `Server-Timing` gives it.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.report import met_cell, progress, summary_ms, write_report
from cache.policy import normalize_prompt
from engine.options import DEFAULT_MODEL
from gateway import server_timing
from gateway.serve_process import ServeProcess

console = Console(stderr=True)

DEFAULT_OUT = Path("bench-results/gateway.json")
ADMIN_KEY = "gateway-bench-admin"
MAX_CHARS = 160  # short chat questions, as in `semgate bench cache`
MAX_ANSWER_CHARS = 1000
MAX_TOKENS = 1
ENGINE_THREADS = 1  # each engine, the server's and the in-process one, on its own core
READY_TIMEOUT_S = 120.0
HIT_P50_GOAL_MS = 15.0
OVERHEAD_P50_GOAL_MS = 5.0
LOOKUP_P50_GOAL_MS = 15.0  # a miss's lookup (its early-started engine request runs beside it)
# Light rewordings that leave the exact tier's key unchanged (it case-folds and drops
# trailing punctuation), and ones that do not (so the semantic tier answers).
SEMANTIC_VARIANTS = ("Please, {q}", "{q} Thanks!")


@dataclass(frozen=True)
class Sizes:
    entries: int  # seeded questions
    rounds: int  # alternating exact / semantic rounds
    hits_per_round: int  # requests per tier per round
    miss_steps: int  # (in-process, HTTP) pairs, half true misses, half no-store
    warmup: int


QUICK = Sizes(entries=100, rounds=2, hits_per_round=50, miss_steps=12, warmup=2)
# 100 pairs per miss mode: with 50, the 95% interval of the paired median spanned ~5 ms
# on this shared 2-core machine, as wide as the goal itself.
FULL = Sizes(entries=400, rounds=4, hits_per_round=100, miss_steps=200, warmup=5)


# Data


def _exchanges(n: int) -> list[tuple[str, str]]:
    """The first `n` ShareGPT (first user turn, its answer) pairs with a short question,
    distinct once case-folded (the exact tier would merge the others)."""
    from bench.sharegpt import first_exchanges

    seen: dict[str, tuple[str, str]] = {}
    for prompt, reply in first_exchanges():
        question, answer = prompt.strip(), reply.strip()[:MAX_ANSWER_CHARS]
        key = normalize_prompt(question)
        if 20 <= len(question) <= MAX_CHARS and answer and key not in seen:
            seen[key] = (question, answer)
            if len(seen) == n:
                break
    if len(seen) < n:
        raise ValueError(f"ShareGPT has only {len(seen)} short first turns, {n} needed")
    return list(seen.values())


def _variant(question: str, i: int, tier: str) -> str:
    """How the i-th probe of a seeded question is worded for a tier. Exact: every other
    one verbatim, else lower case with the trailing punctuation swapped (the exact key
    ignores both). Semantic: a polite prefix or suffix."""
    if tier == "semantic":
        return SEMANTIC_VARIANTS[i % len(SEMANTIC_VARIANTS)].format(q=question)
    if i % 2 == 0:
        return question
    return question.lower().rstrip(" ?!.") + ("?" if question.rstrip().endswith(".") else ".")


# Requests


def _chat_body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": DEFAULT_MODEL,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
    }


def _post_chat(
    client: httpx.Client, body: dict[str, Any], cache_control: str | None = None
) -> tuple[float, httpx.Response, dict[str, Any]]:
    """Seconds from sending to the parsed JSON answer, the response, and that JSON."""
    headers = {"Cache-Control": cache_control} if cache_control else None
    t = time.perf_counter()
    resp = client.post("/v1/chat/completions", json=body, headers=headers)
    data = resp.json()
    elapsed = time.perf_counter() - t
    if resp.status_code != 200:
        raise RuntimeError(f"chat request failed: HTTP {resp.status_code}: {data}")
    return elapsed, resp, data


def _seed(
    client: httpx.Client, exchanges: list[tuple[str, str]], progress: Progress
) -> list[tuple[str, int]]:
    """Seeds the exchanges; returns each question with its answer's token count."""
    task = progress.add_task("seeding the cache (admin API)", total=len(exchanges))
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    seeded = []
    for question, answer in exchanges:
        body = {"question": question, "answer": answer, "model": DEFAULT_MODEL}
        resp = client.post("/admin/cache/entries", json=body, headers=auth)
        if resp.status_code != 201:
            raise RuntimeError(f"seeding failed: HTTP {resp.status_code}: {resp.text}")
        seeded.append((question, resp.json()["metadata"]["completion_tokens"]))
        progress.advance(task)
    return seeded


def _hit_sample(client: httpx.Client, text: str, tier: str, max_tokens: int) -> float | None:
    """Seconds for one request expected to hit in `tier`, or None when it did not."""
    # max_tokens: room for the seeded answer (a longer one is not served), and a wording
    # that misses does not run on to the context length.
    body = _chat_body([{"role": "user", "content": text}], max_tokens)
    elapsed, resp, _ = _post_chat(client, body)
    if resp.headers.get("x-cache-status") != "Hit":
        return None
    exact = resp.headers.get("x-cache-similarity") == "1.0000"
    return elapsed if exact == (tier == "exact") else None


def _bench_hits(
    client: httpx.Client, questions: list[tuple[str, int]], sizes: Sizes, progress: Progress
) -> dict[str, Any]:
    """`questions`: the seeded ones, each with its answer's token count."""
    n = sizes.hits_per_round
    task = progress.add_task("cache hits (exact / semantic)", total=2 * n * sizes.rounds)
    for i, (q, tokens) in enumerate(questions[: sizes.warmup]):
        for tier in ("exact", "semantic"):
            _hit_sample(client, _variant(q, i, tier), tier, tokens)
    times: dict[str, list[float]] = {"exact": [], "semantic": []}
    not_hit = {"exact": 0, "semantic": 0}
    k = 0  # cycles through the seeded questions
    for r in range(sizes.rounds):
        # Alternate which tier goes first from round to round.
        for tier in ("exact", "semantic") if r % 2 == 0 else ("semantic", "exact"):
            for _ in range(n):
                q, tokens = questions[k % len(questions)]
                elapsed = _hit_sample(client, _variant(q, k, tier), tier, tokens)
                k += 1
                if elapsed is None:
                    not_hit[tier] += 1
                else:
                    times[tier].append(elapsed)
                progress.advance(task)
    return {tier: {**summary_ms(times[tier]), "not_hit": not_hit[tier]} for tier in times}


# Misses: in-process against HTTP


def _median_ci(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free 95% confidence interval for the median (order statistics)."""
    n = len(values)
    if n < 6:
        return None
    ordered = sorted(values)
    half = 0.98 * n**0.5  # 1.96 * sqrt(n) / 2
    lo, hi = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half))
    return ordered[lo], ordered[hi]


def _paired(diffs_s: list[float]) -> dict[str, Any]:
    ci = _median_ci([1e3 * d for d in diffs_s])
    return {**summary_ms(diffs_s), "p50_ci95_ms": list(ci) if ci else None}


def _server_e2e_sum(client: httpx.Client, cache_status: str) -> float:
    """The server's summed request latency (seconds) for one cache status, from /metrics:
    measured from the request path's start to its last delta."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        if family.name == "semgate_e2e_request_latency_seconds"
        for sample in family.samples
        if sample.name.endswith("_sum") and sample.labels["cache_status"] == cache_status
    )


async def _in_process(llm: Any, messages: list[dict[str, str]], params: Any) -> tuple[float, int]:
    t = time.perf_counter()
    tokens = 0
    async for out in llm.chat(messages, params):
        tokens = len(out.token_ids)
    return time.perf_counter() - t, tokens


def _bench_misses(
    client: httpx.Client,
    llm: Any,
    runner: asyncio.Runner,
    questions: list[str],
    sizes: Sizes,
    progress: Progress,
) -> dict[str, Any]:
    """Each step runs one unique prompt twice, strictly one after the other: in-process
    and on the server (a true miss or no-store, alternating steps), in alternating
    order. The overhead is the paired difference HTTP - in-process."""
    from engine import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    modes = {"miss": None, "no_store": "no-store"}  # the HTTP side's Cache-Control
    expected = {"miss": "Miss", "no_store": "Bypass"}
    task = progress.add_task("misses: in-process vs HTTP", total=sizes.miss_steps)

    def messages(i: int) -> list[dict[str, str]]:
        # Distinct questions, and a number the guard would not let match another's.
        return [{"role": "user", "content": f"({i + 1}) {questions[i]}"}]

    def over_http(msgs: list[dict[str, str]], mode: str) -> tuple[float, int, str | None]:
        label = expected[mode].lower()
        before = _server_e2e_sum(client, label)
        elapsed, resp, data = _post_chat(client, _chat_body(msgs, MAX_TOKENS), modes[mode])
        served = _server_e2e_sum(client, label) - before
        if served > 0:  # else it was served under another status
            framing[mode].append(elapsed - served)
        if mode == "miss":
            timings = server_timing.parse(resp.headers.get("server-timing", ""))
            if "cache" in timings:
                lookups.append(timings["cache"] / 1e3)
        return (
            elapsed,
            data.get("usage", {}).get("completion_tokens"),
            resp.headers.get("x-cache-status"),
        )

    framing: dict[str, list[float]] = {m: [] for m in modes}
    lookups: list[float] = []  # a true miss's cache lookup (its Server-Timing `cache`)
    for i in range(sizes.warmup):  # the engine and both HTTP modes
        runner.run(_in_process(llm, messages(i), params))
        for mode in modes:
            over_http(messages(i), mode)
    for samples in (*framing.values(), lookups):
        samples.clear()

    times: dict[str, dict[str, list[float]]] = {m: {"in_process": [], "http": []} for m in modes}
    skipped = {"cache_status": 0, "short_answer": 0}
    sides = ("in_process", "http")
    for j in range(sizes.miss_steps):
        i = sizes.warmup + j
        mode = ("miss", "no_store")[j % 2]
        msgs = messages(i)
        got: dict[str, tuple[float, Any, Any]] = {}
        for side in sides if (j // 2) % 2 else reversed(sides):  # each mode, both orders
            if side == "http":
                got[side] = over_http(msgs, mode)
            else:
                got[side] = (*runner.run(_in_process(llm, msgs, params)), None)
        progress.advance(task)
        if got["http"][2] != expected[mode]:
            skipped["cache_status"] += 1
            continue
        if any(got[side][1] != MAX_TOKENS for side in sides):  # the server's engine met EOS
            skipped["short_answer"] += 1
            continue
        for side in sides:
            times[mode][side].append(got[side][0])

    def report(mode: str) -> dict[str, Any]:
        t = times[mode]
        return {
            "in_process": summary_ms(t["in_process"]),
            "http": summary_ms(t["http"]),
            "overhead": _paired([h - a for h, a in zip(t["http"], t["in_process"], strict=True)]),
            # Client time minus the server's own e2e (from /metrics): HTTP, Litestar and
            # JSON outside the request path, free of the engines' noise.
            "http_framing": summary_ms(framing[mode]),
        }

    return {
        "max_tokens": MAX_TOKENS,
        "skipped": skipped,
        **{m: report(m) for m in modes},
        "miss_lookup": summary_ms(lookups),
    }


# The run


def _run(sizes: Sizes, progress: Progress) -> dict[str, Any]:
    from engine import AsyncLLM, EngineConfig

    n_miss = sizes.warmup + sizes.miss_steps
    with tempfile.TemporaryDirectory(prefix="semgate-gateway-bench-") as tmp:
        threads = ["--num-threads", str(ENGINE_THREADS)]
        server = ServeProcess(["--redis-data-dir", tmp, "--admin-key", ADMIN_KEY, *threads])
        loading = progress.add_task("starting the server, loading the engines", total=None)
        started = time.perf_counter()
        server.start()
        try:
            # Loaded while the server starts; it sits idle (no CPU) while the server works.
            llm = AsyncLLM(EngineConfig(num_threads=ENGINE_THREADS))
            exchanges = _exchanges(sizes.entries + n_miss)
            seeded, fresh = exchanges[: sizes.entries], [q for q, _ in exchanges[sizes.entries :]]
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            try:
                with (
                    httpx.Client(
                        base_url=server.url, timeout=120.0, limits=limits, trust_env=False
                    ) as client,
                    asyncio.Runner() as runner,
                ):
                    server.wait_ready(READY_TIMEOUT_S)
                    startup_s = time.perf_counter() - started
                    progress.update(loading, total=1, completed=1)
                    hits = _bench_hits(client, _seed(client, seeded, progress), sizes, progress)
                    misses = _bench_misses(client, llm, runner, fresh, sizes, progress)
            finally:
                llm.shutdown()
        finally:
            server.stop()
    return {"server_ready_s": startup_s, "hits": hits, "misses": misses}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _ms_ci(paired: dict[str, Any]) -> str:
    ci = paired["p50_ci95_ms"]
    if ci is None:
        return _ms(paired["p50_ms"])
    return f"{_ms(paired['p50_ms'])} ({ci[0]:.0f}..{ci[1]:.0f})"


def _below(value: float | None, goal: float) -> bool | None:
    return None if value is None else value < goal


def result_table(result: dict[str, Any]) -> Table:
    table = Table(
        title="semgate gateway over HTTP: p50 unless noted",
        caption="(a..b): 95% confidence interval of a paired median",
    )
    for name in ("metric", "value", "goal", "met?"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    hits, misses = result["hits"], result["misses"]
    for tier in ("exact", "semantic"):
        h = hits[tier]
        goal = f"< {HIT_P50_GOAL_MS:g} ms"
        met = met_cell(_below(h["p50_ms"], HIT_P50_GOAL_MS))
        asked = h["n"] + h["not_hit"]
        table.add_row(f"{tier} hit ({h['n']}/{asked} Hit)", _ms(h["p50_ms"]), goal, met)
        table.add_row("  p90", _ms(h["p90_ms"]), "", "")
        table.add_row("  p99", _ms(h["p99_ms"]), "", "")
    for mode, title in (("miss", "miss"), ("no_store", "no-store")):
        m = misses[mode]
        over = m["overhead"]
        table.add_row(
            f"{title}: in-process (n={over['n']})", _ms(m["in_process"]["p50_ms"]), "", ""
        )
        table.add_row(f"{title}: over HTTP", _ms(m["http"]["p50_ms"]), "", "")
        if mode == "miss":
            goal = f"< {OVERHEAD_P50_GOAL_MS:g} ms"
            met = met_cell(_below(over["p50_ms"], OVERHEAD_P50_GOAL_MS))
            table.add_row(f"{title}: overhead, paired", _ms_ci(over), goal, met)
        else:
            table.add_row(f"{title}: overhead, paired", _ms_ci(over), "", "")
        table.add_row("  p90", _ms(over["p90_ms"]), "", "")
        table.add_row("  of which HTTP framing", _ms(m["http_framing"]["p50_ms"]), "", "")
        if mode == "miss":
            lookup = misses["miss_lookup"]
            met = met_cell(_below(lookup["p50_ms"], LOOKUP_P50_GOAL_MS))
            goal = f"< {LOOKUP_P50_GOAL_MS:g} ms"
            table.add_row("  its cache lookup", _ms(lookup["p50_ms"]), goal, met)
            table.add_row("    p90", _ms(lookup["p90_ms"]), "", "")
    return table


def run_gateway_bench(quick: bool = False, out_path: Path | None = DEFAULT_OUT) -> dict[str, Any]:
    """Runs the benchmark, prints the table, writes the numbers as JSON to out_path."""
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    with progress(console) as bar:
        measured = _run(sizes, bar)
    hits, misses = measured["hits"], measured["misses"]
    result: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "quick": quick,
        "sizes": asdict(sizes),
        "engine_threads": ENGINE_THREADS,
        **measured,
        "goals": {
            "hit_p50_ms_under": HIT_P50_GOAL_MS,
            "miss_overhead_p50_ms_under": OVERHEAD_P50_GOAL_MS,
            "miss_lookup_p50_ms_under": LOOKUP_P50_GOAL_MS,
        },
        "met": {
            "hit_exact": _below(hits["exact"]["p50_ms"], HIT_P50_GOAL_MS),
            "hit_semantic": _below(hits["semantic"]["p50_ms"], HIT_P50_GOAL_MS),
            "miss_overhead": _below(misses["miss"]["overhead"]["p50_ms"], OVERHEAD_P50_GOAL_MS),
            "miss_lookup": _below(misses["miss_lookup"]["p50_ms"], LOOKUP_P50_GOAL_MS),
        },
        "elapsed_s": time.perf_counter() - started,
    }
    out = Console()
    out.print(result_table(result))
    skipped = misses["skipped"]
    out.print(
        f"{sizes.entries} seeded entries; misses: {MAX_TOKENS} greedy token(s), server and "
        f"in-process engines on {ENGINE_THREADS} thread(s) each; steps skipped: "
        f"{skipped['cache_status']} "
        f"unexpected cache status, {skipped['short_answer']} answers under {MAX_TOKENS} "
        f"tokens; {result['elapsed_s']:.0f} s in all"
    )
    write_report(out_path, result)
    return result
