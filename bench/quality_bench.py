"""`semgate bench quality`: what each weight quantization costs in model quality.

Every mode (float32: the GGUF's weights dequantized, over a float32 KV cache; int8
and int4, see engine/quantized_linear.py, over the default bfloat16 KV cache; and
int4 over a float32 one) is built in turn, one engine at a time, and scored on
the same ShareGPT first exchanges: the first N in file order whose chat-formatted
prompt is at most 256 tokens and whose reference answer is at least 16.

1. Perplexity on the reference answers: prompt plus the answer's first 128 tokens,
   teacher-forced through the real model and attention backend as one prefill
   chunk over a scratch KV cache; exp of the mean negative log-likelihood per
   answer token, over all answer tokens of all N items. Every mode scores the very
   same token sequences.
2. Greedy agreement with float32: 32 greedy tokens after each chat-formatted prompt
   (EOS ignored), all prompts in one batch. Agreement is the mean length of the
   prefix shared with float32's tokens over 32; identical is the share of prompts
   whose 32 tokens all match.

Goals: perplexity over float32's within 1% for int8 and within 5% for int4 (int4
over a float32 cache is reported without one).
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.engine_bench import Goal
from bench.greedy import greedy
from bench.report import met_cell, progress, write_report
from bench.sharegpt import first_exchanges
from engine.config import EngineConfig, resolve_model_path
from engine.input_batch import BatchRow, InputBatch
from engine.llm import LLM
from engine.loader import load_tokenizer
from engine.options import DEFAULT_MODEL
from engine.tokenizer import Tokenizer

DEFAULT_OUT = Path("bench-results/quality.json")


class Mode(TypedDict, total=False):
    """The EngineConfig settings a mode sets."""

    quantization: str | None
    kv_cache_dtype: str


# Each mode's engine settings. float32 is float32 throughout, the reference; the weight
# modes run over the default KV cache (bfloat16 on CPU: kv_cache_dtype), and int4 once
# more over a float32 one, to show what the cache's rounding costs alone.
MODES: dict[str, Mode] = {
    "float32": {"quantization": None, "kv_cache_dtype": "float32"},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
    "int4, f32 KV": {"quantization": "int4", "kv_cache_dtype": "float32"},
}
PERPLEXITY_GOALS = {"int8": 1.01, "int4": 1.05}  # most perplexity / float32's
MAX_PROMPT_TOKENS = 256
MIN_ANSWER_TOKENS = 16
ANSWER_TOKENS = 128  # scored per answer
GREEDY_TOKENS = 32
Item = tuple[list[int], list[int]]  # chat-formatted prompt ids, answer ids


@dataclass(frozen=True)
class Sizes:
    items: int  # exchanges scored for perplexity; their prompts are the greedy prompts


FULL = Sizes(items=64)
QUICK = Sizes(items=8)


def select_items(tokenizer: Tokenizer, count: int) -> list[Item]:
    """The first count ShareGPT exchanges that fit, the answer cut to ANSWER_TOKENS."""
    items: list[Item] = []
    for prompt, answer in first_exchanges():
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        prompt_ids = tokenizer.encode(text)
        # The answer continues the prompt: no BOS or other special tokens of its own.
        answer_ids = tokenizer.backend.encode(answer, add_special_tokens=False).ids
        if len(prompt_ids) <= MAX_PROMPT_TOKENS and len(answer_ids) >= MIN_ANSWER_TOKENS:
            items.append((prompt_ids, answer_ids[:ANSWER_TOKENS]))
            if len(items) == count:
                return items
    raise ValueError(f"ShareGPT has only {len(items)} exchanges that fit the length caps")


@torch.inference_mode()
def answer_logprobs(llm: LLM, prompt_ids: list[int], answer_ids: list[int]) -> torch.Tensor:
    """The model's log-probability of each answer token after the prompt and the answer
    before it: the whole sequence as one prefill chunk over a scratch KV cache, the way
    the runner forwards a prompt (ModelRunner.compute_logits), keeping every answer row."""
    engine = llm.engine
    cfg, bs, device = engine.model_config, engine.runner.block_size, engine.runner.device
    ids = prompt_ids + answer_ids
    num_blocks = -(-len(ids) // bs)
    attention = engine.runner.attention
    kv_caches = attention.allocate_kv_cache(
        cfg.num_layers, num_blocks + 1, bs, cfg.num_kv_heads, cfg.head_dim
    )
    inputs = InputBatch(
        attention,
        bs,
        device,
        max_num_tokens=len(ids),
        max_num_seqs=1,
        max_model_len=len(ids),
        null_block=num_blocks,
    )
    step = inputs.build([BatchRow(ids, 0, list(range(num_blocks)), 0)])
    hidden = engine.model(step.input_ids, step.positions, attention, kv_caches, step.attn_meta)
    # Row t predicts token t + 1: the rows from the prompt's last token on.
    rows = hidden[len(prompt_ids) - 1 : len(ids) - 1]
    logprobs = F.log_softmax(engine.model.compute_logits(rows), dim=-1)
    return logprobs.gather(1, torch.tensor(answer_ids, device=device)[:, None])[:, 0].cpu()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def score_mode(
    model: str, mode: str, items: list[Item], prog: Progress
) -> tuple[dict[str, Any], list[list[int]]]:
    """One mode's perplexity over items, and its greedy tokens after each prompt."""
    started = time.perf_counter()
    llm = LLM(EngineConfig(model, **MODES[mode], prefix_caching=False))
    task = prog.add_task(f"{mode}: perplexity, then greedy", total=len(items) + 1)
    nll = 0.0
    for prompt_ids, answer_ids in items:
        nll -= answer_logprobs(llm, prompt_ids, answer_ids).double().sum().item()
        prog.advance(task)
    outputs = llm.generate([p for p, _ in items], greedy(GREEDY_TOKENS))
    prog.advance(task)
    del llm
    gc.collect()
    mean_nll = nll / sum(len(a) for _, a in items)
    result = {
        "mean_nll": mean_nll,
        "perplexity": math.exp(mean_nll),
        "elapsed_s": time.perf_counter() - started,
    }
    return result, [out.token_ids for out in outputs]


def _run_all(model: str, items: list[Item], prog: Progress) -> tuple[dict[str, Any], list[Goal]]:
    modes: dict[str, dict[str, Any]] = {}
    reference: list[list[int]] = []
    for mode in MODES:
        modes[mode], tokens = score_mode(model, mode, items, prog)
        if mode == "float32":  # the first mode: the others are compared with it
            reference = tokens
        shared = [_common_prefix(g, r) for g, r in zip(tokens, reference, strict=True)]
        modes[mode]["agreement"] = sum(shared) / (GREEDY_TOKENS * len(items))
        modes[mode]["identical_share"] = sum(n == GREEDY_TOKENS for n in shared) / len(items)
    base = modes["float32"]["perplexity"]
    for result in modes.values():
        result["perplexity_ratio"] = result["perplexity"] / base
    goals = [
        Goal(
            f"{mode}_perplexity",
            f"{mode} perplexity / float32",
            "ppl",
            modes[mode]["perplexity"],
            base,
            modes[mode]["perplexity_ratio"],
            "<=",
            target,
        )
        for mode, target in PERPLEXITY_GOALS.items()
    ]
    return modes, goals


def quality_table(modes: dict[str, dict[str, Any]], goals: list[Goal], n: int) -> Table:
    table = Table(
        title=f"weight and KV cache quantization vs float32: {n} ShareGPT answers",
        caption=f"perplexity of up to {ANSWER_TOKENS} answer tokens; "
        f"greedy: {GREEDY_TOKENS} tokens each, prefix shared with float32",
    )
    for name in ("Mode", "Perplexity", "Ratio", "Agreement", "Identical", "Goal", "Met"):
        table.add_column(name, justify="left" if name == "Mode" else "right")
    by_mode = {g.name.removesuffix("_perplexity"): g for g in goals}
    for mode, r in modes.items():
        goal = by_mode.get(mode)
        # Rounded up, so a miss never reads as met.
        ratio = math.ceil(r["perplexity_ratio"] * 1000) / 1000
        table.add_row(
            mode,
            f"{r['perplexity']:.3f}",
            f"{ratio:.3f}x",
            f"{r['agreement']:.1%}",
            f"{r['identical_share']:.1%}",
            f"{goal.op} {goal.target:g}x" if goal else "-",
            met_cell(goal.met if goal else None),
        )
    return table


def run_quality_bench(
    quick: bool = False,
    out_path: Path | None = DEFAULT_OUT,
    model: str = DEFAULT_MODEL,
    console: Console | None = None,
) -> dict[str, Any]:
    """Scores every mode, prints the table, writes the numbers as JSON to out_path."""
    console = console or Console()
    sizes = QUICK if quick else FULL
    started = time.perf_counter()
    with progress(console) as prog:
        loading = prog.add_task("selecting ShareGPT exchanges", total=None)
        items = select_items(load_tokenizer(resolve_model_path(model)), sizes.items)
        prog.update(loading, total=1, completed=1)
        modes, goals = _run_all(model, items, prog)
    report: dict[str, Any] = {
        "model": model,
        "quick": quick,
        "sizes": asdict(sizes),
        "prompt_tokens": sum(len(p) for p, _ in items),
        "answer_tokens": sum(len(a) for _, a in items),
        "greedy_tokens": GREEDY_TOKENS * len(items),
        "modes": modes,
        "goals": {g.name: {**asdict(g), "met": g.met} for g in goals},
        "elapsed_s": time.perf_counter() - started,
    }
    write_report(out_path, report)
    console.print(quality_table(modes, goals, len(items)))
    where = f"Wrote {out_path}" if out_path is not None else "Done"
    console.print(f"{where} in {report['elapsed_s']:.0f} s")
    return report
