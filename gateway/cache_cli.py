"""`semgate cache ...`: calibrate the threshold against labelled pairs."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from cache import CalibrationReport


def cmd_cache_calibrate(args: argparse.Namespace) -> int:
    from cache import CacheRuntime, calibrate, load_pairs

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
    table = Table("", "precision", "recall", "hits", "false hits", "unjudged hits")
    for name, s in (("with guard", r.with_guard), ("without guard", r.without_guard)):
        table.add_row(
            name,
            f"{s.precision:.3f}",
            f"{s.recall:.3f}",
            str(s.hits),
            str(s.false_hits),
            str(s.unjudged_hits),
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
        type=float,
        default=None,
        help="similarity threshold to score (default: the configured one)",
    )
    cal.add_argument("--target-precision", type=float, default=0.95)
    cal.set_defaults(func=cmd_cache_calibrate)
