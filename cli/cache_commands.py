"""`semgate cache ...`: calibrate the threshold against labelled pairs, and fit the
guard's overlap bar to them."""

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


def cmd_cache_fit_overlap(args: argparse.Namespace) -> int:
    from bench.calibrate import load_pairs
    from bench.overlap_fit import bar_file, fit_bar, held_out, measure
    from cache import DEFAULT_THRESHOLD, Embedder, Guard
    from cache.overlap import DEFAULT_CEILING, DEFAULT_TARGET_PRECISION

    floor = DEFAULT_THRESHOLD if args.floor is None else args.floor
    ceiling = DEFAULT_CEILING if args.ceiling is None else args.ceiling
    target = DEFAULT_TARGET_PRECISION if args.target_precision is None else args.target_precision

    files = {str(path): load_pairs(path) for path in args.pairs}
    console = Console(stderr=True)
    with console.status(f"measuring {sum(map(len, files.values()))} pairs ..."):
        embedder = Embedder()
        try:
            guard = Guard()
            measured = {name: measure(pairs, embedder, guard) for name, pairs in files.items()}
        finally:
            embedder.close()
    rows = [r for rs in measured.values() for r in rs]
    bar = fit_bar(rows, floor, target, ceiling)
    if args.write is not None:
        args.write.write_text(bar_file(bar, floor, target, list(files)))
        console.print(f"wrote the bar and the fit's inputs to {args.write}")
    scores = held_out(measured, floor, target, ceiling) if len(files) > 1 else []
    if args.json:
        print(json.dumps({"bar": asdict(bar), "held_out": [asdict(s) for s in scores]}, indent=2))
        return 0
    out = Console()
    out.print(
        f"overlap bar: base={bar.base}, per_jaccard={bar.per_jaccard}, "
        f"per_sequence={bar.per_sequence}, ceiling={bar.ceiling} "
        f"(floor {floor}, target {target})"
    )
    if scores:
        table = Table(
            "held-out file",
            "precision / recall (no bar)",
            "false hits",
            "precision / recall (bar)",
            "false hits",
            title="each file scored pair by pair with the bar fitted on the others",
        )
        for s in scores:
            table.add_row(
                Path(s.name).stem,
                f"{s.without_bar.precision:.3f} / {s.without_bar.recall:.3f}",
                str(s.without_bar.false_hits),
                f"{s.with_bar.precision:.3f} / {s.with_bar.recall:.3f}",
                str(s.with_bar.false_hits),
            )
        out.print(table)
    return 0


def add_cache_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
        "fit-overlap", help="fit the guard's overlap bar to labelled pairs, scored file by file"
    )
    fit.add_argument(
        "--pairs",
        type=Path,
        nargs="+",
        required=True,
        help="JSONL files of labelled pairs; with several, each is also scored held out",
    )
    fit.add_argument(
        "--floor",
        type=fraction,
        default=None,
        help="the similarity threshold the bar sits above (default: the default threshold)",
    )
    fit.add_argument(
        "--target-precision",
        type=fraction,
        default=None,
        help="the precision the bar is fitted for (default: DEFAULT_TARGET_PRECISION in "
        "cache/overlap.py)",
    )
    fit.add_argument(
        "--ceiling",
        type=fraction,
        default=None,
        help="the most similarity the bar asks for (default: DEFAULT_CEILING in "
        "cache/overlap.py, set by hand)",
    )
    fit.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="JSON",
        help="also write the bar and the fit's inputs to this file (the guard loads "
        "cache/overlap_bar.json)",
    )
    fit.add_argument("--json", action="store_true", help="print the bar and scores as JSON")
    fit.set_defaults(func=cmd_cache_fit_overlap)
