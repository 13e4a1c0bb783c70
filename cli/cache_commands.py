"""`semgate cache ...`: calibrate the threshold against labelled pairs, and fit the
guard's verifier to them."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from cli.parser import fraction

if TYPE_CHECKING:
    from bench.calibrate import CalibrationReport


def cmd_cache_calibrate(args: argparse.Namespace) -> int:
    from bench.calibrate import calibrate, load_pairs
    from cache import CacheRuntime

    pairs = load_pairs(args.pairs)
    console = Console(stderr=True)

    async def run() -> CalibrationReport:
        async with CacheRuntime(redis_url=os.environ.get("REDIS_URL") or None) as cache:
            return await calibrate(
                cache, pairs, threshold=args.threshold, target_precision=args.target_precision
            )

    with console.status(f"calibrating on {len(pairs)} pairs ..."):
        report = asyncio.run(run())
    if args.json:
        print(report.to_json())
        return 0
    _print_report(report)
    return 0


def _print_report(r: CalibrationReport) -> None:
    console = Console()
    console.print(
        f"{r.pairs} pairs, {r.queries} distinct queries, {r.answerable} with a correct "
        f"cached answer; threshold {r.threshold:.3f}"
    )
    table = Table(
        "",
        "precision",
        "recall",
        "hits",
        "false hits",
        "unjudged hits",
        "precision (all hits)",
    )
    for name, s in (("with guard", r.with_guard), ("without guard", r.without_guard)):
        table.add_row(
            name,
            f"{s.precision:.3f}",
            f"{s.recall:.3f}",
            str(s.hits),
            str(s.false_hits),
            str(s.unjudged_hits),
            f"{s.precision_all_hits:.3f}",
        )
    console.print(table)
    curve = Table(
        "threshold",
        "precision (guard)",
        "recall (guard)",
        "precision (no guard)",
        "recall (no guard)",
        title="precision / recall by threshold",
    )
    for g, n in zip(r.curve_with_guard, r.curve_without_guard, strict=True):
        curve.add_row(
            f"{g.threshold:.3f}",
            f"{g.precision:.3f}",
            f"{g.recall:.3f}",
            f"{n.precision:.3f}",
            f"{n.recall:.3f}",
        )
    console.print(curve)
    rec = r.recommended_threshold
    console.print(
        f"lowest threshold with precision >= {r.target_precision:.2f} (guard on): "
        + (f"{rec:.3f}" if rec is not None else "none reaches it")
    )


def cmd_cache_fit(args: argparse.Namespace) -> int:
    from bench.calibrate import load_pairs
    from bench.cross_encoder_fit import read_held_out
    from bench.verifier_fit import (
        fit,
        held_out,
        language_thresholds,
        measure_english,
        measure_multilingual,
        score_pairs,
        verifier_file,
    )
    from cache import DEFAULT_THRESHOLD, Embedder, Guard, MultilingualEmbedder
    from cache.guard import cross_encoder
    from cache.guard.verifier import TARGET_PRECISION

    floor = DEFAULT_THRESHOLD if args.floor is None else args.floor
    english = {str(path): load_pairs(path) for path in args.pairs}
    other = {str(path): load_pairs(path) for path in args.multilingual}
    scored = {str(path): load_pairs(path) for path in args.score}
    console = Console(stderr=True)
    with console.status("measuring the pairs ..."):
        embedder, multilingual = Embedder(), MultilingualEmbedder()
        try:
            guard = Guard()
            cross = read_held_out(cross_encoder.WEIGHTS, english, guard.cross.dtype)
            en = {n: measure_english(p, embedder, guard, cross[n]) for n, p in english.items()}
            ml = {n: measure_multilingual(p, multilingual) for n, p in other.items()}
            scored_en = {n: measure_english(p, embedder, guard) for n, p in scored.items()}
            scored_ml = {n: measure_multilingual(p, multilingual) for n, p in scored.items()}
        finally:
            embedder.close()
            multilingual.close()
    en_rows = [r for rs in en.values() for r in rs]
    ml_rows = [r for rs in ml.values() for r in rs]
    en_features, ml_features = tuple(en_rows[0].features), tuple(ml_rows[0].features)
    thresholds = language_thresholds(ml_rows)
    verifiers = {
        "english": fit(en_rows, floor, TARGET_PRECISION["english"], en_features),
        "multilingual": fit(ml_rows, thresholds, TARGET_PRECISION["multilingual"], ml_features),
    }
    if args.write is not None:
        fitted_on = {
            "english": list(english),
            "multilingual": list(other),
            "floor": floor,
            "target_precision": TARGET_PRECISION,
        }
        args.write.write_text(verifier_file(verifiers, fitted_on))
        console.print(f"wrote the verifiers and the fit's inputs to {args.write}")
    rows = [
        (Path(s.name).stem, "held out", s.score)
        for s in [
            *held_out(en, floor, TARGET_PRECISION["english"], en_features),
            *held_out(ml, None, TARGET_PRECISION["multilingual"], ml_features),
        ]
    ]
    for name in scored:
        rows.append(
            (Path(name).stem, "english", score_pairs(scored_en[name], floor, verifiers["english"]))
        )
        ml_score = score_pairs(scored_ml[name], thresholds, verifiers["multilingual"])
        rows.append((Path(name).stem, "multilingual", ml_score))
    if args.json:
        print(
            json.dumps(
                {
                    "verifiers": {n: v.to_dict() for n, v in verifiers.items()},
                    "scores": [[n, how, asdict(s)] for n, how, s in rows],
                },
                indent=2,
            )
        )
        return 0
    out = Console()
    out.print(f"thresholds by language: {thresholds}")
    table = Table("file", "model", "precision", "recall", "hits", "false hits",
                  title="each file scored pair by pair: fit sets held out, --score files "
                  "by the models fitted on every fit set")  # fmt: skip
    for name, how, s in rows:
        table.add_row(name, how, f"{s.precision:.3f}", f"{s.recall:.3f}", str(s.hits),
                      str(s.false_hits))  # fmt: skip
    out.print(table)
    return 0


def cmd_cache_train_cross_encoder(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from bench.calibrate import load_pairs
    from bench.cross_encoder_fit import FOLDS, held_out_logits, save, train

    files = {str(path): load_pairs(path) for path in args.pairs}
    with Progress(console=Console(stderr=True)) as progress:
        fits = iter([*(f"fold {k + 1} of {FOLDS}" for k in range(FOLDS)), "all pairs"])
        task = progress.add_task("", total=None)

        def report(step: int, steps: int, loss: float) -> None:
            if step == 1:
                progress.update(task, description=next(fits))
            progress.update(task, completed=step, total=steps)

        held_out = held_out_logits(files, progress=report)
        model = train([p for ps in files.values() for p in ps], progress=report)
    save(model.tensors(), args.write, files, held_out)
    n = sum(map(len, files.values()))
    Console().print(f"wrote the cross-encoder (fitted on {n} pairs) to {args.write}")
    return 0


def add_cache_commands(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser("cache", help="semantic cache tools")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True)
    cal = cache_sub.add_parser(
        "calibrate", help="precision/recall of the cache on labelled pairs, and a threshold"
    )
    cal.add_argument(
        "--pairs",
        type=Path,
        required=True,
        help='JSONL lines {"cached": ..., "query": ..., "label": 0|1}',
    )
    cal.add_argument("--json", action="store_true", help="print the report as JSON")
    cal.add_argument(
        "--threshold",
        type=fraction,
        default=None,
        help="similarity threshold to score (default: the configured one)",
    )
    cal.add_argument(
        "--target-precision", type=fraction, default=0.95, help="the threshold to suggest keeps it"
    )
    cal.set_defaults(func=cmd_cache_calibrate)
    fit = cache_sub.add_parser(
        "fit", help="fit the guard's verifier to labelled pairs, and score it file by file"
    )
    fit.add_argument(
        "--pairs",
        type=Path,
        nargs="+",
        required=True,
        help="the English fit sets (JSONL labelled pairs); each is also scored held out",
    )
    fit.add_argument(
        "--multilingual",
        type=Path,
        nargs="+",
        required=True,
        help="the multilingual fit sets; each is also scored held out",
    )
    fit.add_argument(
        "--score",
        type=Path,
        nargs="*",
        default=[],
        help="held-back sets to score, pair by pair, with the models fitted on every fit set",
    )
    fit.add_argument(
        "--floor",
        type=fraction,
        default=None,
        help="the English tier's similarity threshold the verifier sits above (default: "
        "the default threshold)",
    )
    fit.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="JSON",
        help="also write the models and the fit's inputs to this file (the guards load "
        "cache/guard/verifier.json)",
    )
    fit.add_argument("--json", action="store_true", help="print the models and scores as JSON")
    fit.set_defaults(func=cmd_cache_fit)
    train = cache_sub.add_parser(
        "train-cross-encoder",
        help="fit the cross-encoder (a LoRA adapter of the bundled MiniLM) to labelled English "
        "pairs; refit the verifier after (`cache fit`)",
    )
    train.add_argument(
        "--pairs", type=Path, nargs="+", required=True, help="the English fit sets (JSONL)"
    )
    train.add_argument(
        "--write",
        type=Path,
        required=True,
        metavar="SAFETENSORS",
        help="where to write the adapter (the guard loads cache/guard/cross_encoder.safetensors)",
    )
    train.set_defaults(func=cmd_cache_train_cross_encoder)
