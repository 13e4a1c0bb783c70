"""`semgate bench spec`: speculative decoding on against off, in one process.

Two workloads of real ShareGPT prompts, sent as chat, greedy, each answer ending at
EOS or max_tokens (speculation is lossless, so both sides generate the same tokens):

- input-grounded: conversations whose answer quotes the prompt (at least half of
  the reference answer's 4-grams appear in the prompt: code to fix, text to
  rewrite, summarise or extract from);
- open chat: the first ShareGPT prompts in file order, whatever they ask.

Batch 1 measures decode speed, prefill left out: (N - 1) tokens over the time from
the first token to the last, each prompt run with every configuration in turn (off,
ngram, draft, off, ...), reporting the median of the per-prompt speedups. Batch 8
sends 8 prompts at once and counts output tokens over wall time, alternating
configurations and repeating. Every method reports its acceptance rate (accepted /
proposed tokens) and mean accepted length (tokens a speculating step yields).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.report import met_cell, progress, write_report
from bench.sharegpt import MIN_LEN, first_exchanges, sample_requests
from engine.config import EngineConfig
from engine.llm import LLM
from engine.metrics import EngineStats
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer

DEFAULT_OUT = Path("bench-results/spec.json")
METHODS = ("ngram", "draft")
NGRAM_GROUNDED_GOAL = 2.0  # batch 1, input-grounded prompts, n-gram lookup
NEVER_SLOWER_GOAL = 0.95  # everything else: speculation must not cost real speed


@dataclass(frozen=True)
class Sizes:
    prompts: int  # per workload at batch 1
    max_tokens: int
    batch_repeats: int  # alternations of the batch-8 runs


FULL = Sizes(prompts=10, max_tokens=128, batch_repeats=2)
QUICK = Sizes(prompts=4, max_tokens=64, batch_repeats=1)
MAX_PROMPT_TOKENS = 1200
QUOTE_SHARE = 0.5


def _ngrams(ids: list[int], n: int = 4) -> set[tuple[int, ...]]:
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


def grounded_prompts(tokenizer: Tokenizer, count: int) -> list[str]:
    """ShareGPT prompts whose reference answer mostly quotes them."""
    found: list[str] = []
    for prompt, answer in first_exchanges():
        p_ids, a_ids = tokenizer.encode(prompt), tokenizer.encode(answer)
        if not 4 * MIN_LEN <= len(p_ids) <= MAX_PROMPT_TOKENS or len(a_ids) < 64:
            continue
        answer_grams = _ngrams(a_ids)
        if len(answer_grams & _ngrams(p_ids)) >= QUOTE_SHARE * len(answer_grams):
            found.append(prompt)
            if len(found) == count:
                return found
    raise ValueError(f"ShareGPT has only {len(found)} input-grounded prompts")


def _chat(tokenizer: Tokenizer, prompt: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": prompt}]))


def _decode_tps(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[float, list[int]]:
    out = llm.generate(prompt, params)[0]
    times = out.metrics.token_times
    if len(times) < 2:
        return float("nan"), out.token_ids
    return (len(times) - 1) / (times[-1] - times[0]), out.token_ids


def _spec_counts(llm: LLM) -> tuple[int, int, int]:
    s = llm.engine.get_stats()
    return s.spec_num_drafts, s.spec_draft_tokens, s.spec_accepted_tokens


def _acceptance(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, Any]:
    drafts, proposed, accepted = (b - a for a, b in zip(before, after, strict=True))
    # The engine's own formulas, over this measurement's counts.
    window = EngineStats(
        spec_num_drafts=drafts, spec_draft_tokens=proposed, spec_accepted_tokens=accepted
    )
    return {
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": window.spec_acceptance_rate,
        "mean_accepted_length": window.spec_mean_accepted_length,
    }


def _batch1(
    engines: dict[str, LLM], prompts: list[list[int]], params: SamplingParams, prog: Any
) -> dict[str, Any]:
    tps: dict[str, list[float]] = {name: [] for name in engines}
    before = {m: _spec_counts(engines[m]) for m in METHODS}
    task = prog.add_task("batch 1", total=len(prompts))
    for prompt in prompts:
        reference = None
        for name, llm in engines.items():
            speed, tokens = _decode_tps(llm, prompt, params)
            if reference is None:
                reference = tokens
            elif tokens != reference:
                raise AssertionError(f"{name} changed a greedy answer: speculation is not lossless")
            tps[name].append(speed)
        prog.advance(task)
    result: dict[str, Any] = {"off_tokens_per_s": statistics.median(tps["off"])}
    for m in METHODS:
        ratios = [on / off for on, off in zip(tps[m], tps["off"], strict=True)]
        result[m] = {
            "tokens_per_s": statistics.median(tps[m]),
            "speedup_median": statistics.median(ratios),
            "speedup_min": min(ratios),
            **_acceptance(before[m], _spec_counts(engines[m])),
        }
    return result


def _batch8(
    engines: dict[str, LLM], prompts: list[list[int]], params: SamplingParams, repeats: int
) -> dict[str, Any]:
    tps: dict[str, list[float]] = {name: [] for name in engines}
    before = {m: _spec_counts(engines[m]) for m in METHODS}
    for _ in range(repeats):
        for name, llm in engines.items():
            started = time.perf_counter()
            outs = llm.generate(prompts, params)
            tps[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - started))
    off = statistics.median(tps["off"])
    result: dict[str, Any] = {"off_tokens_per_s": off}
    for m in METHODS:
        on = statistics.median(tps[m])
        result[m] = {
            "tokens_per_s": on,
            "speedup_median": on / off,
            **_acceptance(before[m], _spec_counts(engines[m])),
        }
    return result


def run_spec_bench(quick: bool = False, out_path: Path | None = DEFAULT_OUT) -> dict[str, Any]:
    sizes = QUICK if quick else FULL
    console = Console()
    engines = {
        "off": LLM(EngineConfig()),
        "ngram": LLM(EngineConfig(spec_method="ngram")),
        "draft": LLM(EngineConfig(spec_method="draft")),
    }
    tokenizer = engines["off"].tokenizer
    count = max(8, sizes.prompts)
    workloads = {
        "grounded": [_chat(tokenizer, p) for p in grounded_prompts(tokenizer, count)],
        "open chat": [
            _chat(tokenizer, p)
            for p, _ in sample_requests(tokenizer, count, MAX_PROMPT_TOKENS, sizes.max_tokens)
        ],
    }
    params = SamplingParams(max_tokens=sizes.max_tokens, temperature=0.0)
    results: dict[str, Any] = {"sizes": sizes.__dict__, "batch1": {}, "batch8": {}}
    with progress(console) as prog:
        for name, prompts in workloads.items():
            results["batch1"][name] = _batch1(engines, prompts[: sizes.prompts], params, prog)
            results["batch8"][name] = _batch8(engines, prompts[:8], params, sizes.batch_repeats)
    _print(console, results)
    write_report(out_path, results)
    return results


def _goal(workload: str, batch: int, method: str) -> float:
    if (workload, batch, method) == ("grounded", 1, "ngram"):
        return NGRAM_GROUNDED_GOAL
    return NEVER_SLOWER_GOAL


def _print(console: Console, results: dict[str, Any]) -> None:
    table = Table(title="speculative decoding: on vs off (greedy, same tokens)")
    for col in ("workload", "batch", "method", "off tok/s", "on tok/s", "speedup",
                "acceptance", "mean len", "goal", "met"):  # fmt: skip
        table.add_column(col)
    for key, batch in (("batch1", 1), ("batch8", 8)):
        for workload, r in results[key].items():
            for m in METHODS:
                x = r[m]
                goal = _goal(workload, batch, m)
                rate, length = x["acceptance_rate"], x["mean_accepted_length"]
                table.add_row(
                    workload,
                    str(batch),
                    m,
                    f"{r['off_tokens_per_s']:.1f}",
                    f"{x['tokens_per_s']:.1f}",
                    f"{x['speedup_median']:.2f}x",
                    "-" if rate is None else f"{rate:.2f}",
                    "-" if length is None else f"{length:.2f}",
                    f">= {goal}x",
                    met_cell(x["speedup_median"] >= goal),
                )
    console.print(table)
