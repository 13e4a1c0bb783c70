"""A rate sweep judged against SLOs: per side and rate the SLO attainment (both SLOs, each
alone, long and short prompts apart) and latency percentiles, each side's goodput, the
headline ratio; written as results.json, attainment.png and report.md, and read back from
results.json to be judged again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from loadtest.record import RequestRecord
from loadtest.slo import GOODPUT_ATTAINMENT, Goodput, Slo, attainment, goodput
from loadtest.sweep import SweepResult
from loadtest.work_item import WorkloadOptions

GOODPUT_GOAL = 1.3  # issue 49: disaggregated goodput at least 1.3x colocated
_CURVES = {
    "attainment": "both SLOs",
    "ttft_attainment": "TTFT SLO alone",
    "itl_attainment": "ITL SLO alone",
}


def rate_summary(records: list[RequestRecord], elapsed: float, slo: Slo) -> dict[str, Any]:
    """One side at one rate: attainment over every request sent, long and short prompts
    apart; TTFT and per-request ITL percentiles over the completed ones."""
    from bench.report import summary_ms

    done = [r for r in records if r.ok]
    itls = [itl for r in done if (itl := slo.itl_ms_of(r)) is not None]
    return {
        **attainment(records, slo),
        "long": attainment([r for r in records if r.long], slo),
        "short": attainment([r for r in records if not r.long], slo),
        "completed": len(done),
        "request_throughput": len(done) / elapsed if elapsed > 0 else 0.0,
        "ttft": summary_ms([r.ttft for r in done if r.ttft is not None]),
        "request_itl": summary_ms([itl / 1e3 for itl in itls]),
    }


def judge(result: SweepResult, slo: Slo) -> dict[str, Any]:
    """Per side: its rates' summaries and its goodput; the headline over the first two."""
    sides: dict[str, Any] = {}
    goodputs: dict[str, Goodput] = {}
    for label, by_rate in result.records.items():
        rates = [
            {"rate": rate, **rate_summary(records, result.elapsed[label][rate], slo)}
            for rate, records in sorted(by_rate.items())
        ]
        goodputs[label] = goodput({r["rate"]: r["attainment"] for r in rates})
        sides[label] = {"rates": rates, "goodput": goodputs[label].as_dict()}
    # One side alone (a run of one configuration) has nothing to compare with.
    compared = headline(goodputs) if len(goodputs) > 1 else None
    return {"slo": dataclasses.asdict(slo), "sides": sides, "headline": compared}


def headline(goodputs: dict[str, Goodput]) -> dict[str, Any]:
    """The feature's goodput over the baseline's (the first two sides), from each one's
    estimate: the crossing, else the swept rate. A ratio with the feature above the sweep
    is a lower bound; with the baseline below it there is none."""
    (feature, ours), (baseline, theirs) = list(goodputs.items())[:2]
    mine, other = ours.estimate(), theirs.estimate()
    ratio = mine / other if mine is not None and other is not None else None
    text = f"**goodput**: {feature} {ours.describe()}; {baseline} {theirs.describe()}"
    if ratio is not None:
        bound = "at least " if ours.above_sweep else ""
        text += f": {bound}{ratio:.2f}x {baseline}'s with {feature}"
    met = None if ratio is None else ratio >= GOODPUT_GOAL
    verdict = {True: "met", False: "not met", None: "not measured in this sweep"}[met]
    text += f" (goal: at least {GOODPUT_GOAL:g}x; {verdict})."
    return {
        "ratio": ratio,
        "lower_bound": ours.above_sweep,
        "goal": GOODPUT_GOAL,
        "met": met,
        "text": text,
    }


def attainment_plot(summary: dict[str, Any], path: Path) -> None:
    """Attainment against rate for every side: of both SLOs, and of each alone (which
    one limits it), with the goodput line at 90%."""
    fig = Figure(figsize=(13, 4), layout="constrained")
    axes = dict(zip(_CURVES, fig.subplots(1, 3, sharey=True), strict=True))
    for label, side in summary["sides"].items():
        rates = [r["rate"] for r in side["rates"]]
        for key, ax in axes.items():
            values = [r[key] for r in side["rates"]]
            ax.plot(rates, values, "o-", label=label)
    target = next(iter(summary["sides"].values()))["goodput"]["target"]
    for key, ax in axes.items():
        ax.axhline(target, color="black", ls="--", lw=1, label=f"{target:.0%}")
        ax.set(
            xlabel="request rate (req/s)", title=f"SLO attainment: {_CURVES[key]}", ylim=(0, 1.05)
        )
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower left")
    axes["attainment"].set_ylabel("share of requests meeting the SLO")
    fig.savefig(path, dpi=110)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _ms(stats: dict[str, Any]) -> str:
    return " / ".join("-" if stats[k] is None else f"{stats[k]:,.0f}" for k in ("p50_ms", "p90_ms"))


def rates_table(summary: dict[str, Any]) -> str:
    lines = [
        "| rate (req/s) | side | completed / sent | attainment: both / TTFT / ITL | "
        "long / short: both | TTFT p50 / p90 (ms) | request ITL p50 / p90 (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    by_rate: dict[float, list[tuple[str, dict[str, Any]]]] = {}
    for label, side in summary["sides"].items():
        for row in side["rates"]:
            by_rate.setdefault(row["rate"], []).append((label, row))
    for rate, rows in sorted(by_rate.items()):
        for label, r in rows:
            both = " / ".join(_pct(r[k]) for k in _CURVES)
            kinds = f"{_pct(r['long']['attainment'])} / {_pct(r['short']['attainment'])}"
            lines.append(
                f"| {rate:g} | {label} | {r['completed']} / {r['requests']} | {both} | {kinds} "
                f"| {_ms(r['ttft'])} | {_ms(r['request_itl'])} |"
            )
    return "\n".join(lines)


def servers_table(servers: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["| side | server | counter | gained |", "|---|---|---|---|"]
    lines += [
        f"| {label} | {name} | `{counter}` | {gain:,.6g} |"
        for label, side in servers.items()
        for name, gains in side.items()
        for counter, gain in gains.items()
    ]
    return "\n".join(lines)


def headline_text(summary: dict[str, Any]) -> str:
    """The headline in Markdown; a side alone: its goodput."""
    if summary["headline"] is not None:
        return str(summary["headline"]["text"])
    ((label, side),) = summary["sides"].items()
    return f"**goodput**: {label} {side['goodput']['text']}."


def markdown_report(result: SweepResult, summary: dict[str, Any], about: str, slo: Slo) -> str:
    options = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(result.options).items())
    rates = ", ".join(f"{rate:g}" for rate in result.rates)
    header = [
        f"- date: {result.date}; commit: `{result.commit}`",
        *(f"- {label}: `{command}`" for label, command in result.settings.items()),
        f"- workload: `mixed` ({options}); num_requests per rate and side",
        f"- load: open loop, Poisson arrivals at {rates} req/s in turn (seeds {result.seed} "
        "up), the sides alternating which goes first",
        f"- SLOs per request: {slo.describe()}; goodput: the highest rate at which at least "
        f"{GOODPUT_ATTAINMENT:.0%} of the requests sent meet both",
    ]
    return (
        "# Scenario: pd\n\n" + "\n".join(header) + f"\n\n{about}\n\n{headline_text(summary)}"
        f"\n\n{rates_table(summary)}\n\n![SLO attainment against rate](attainment.png)\n\n"
        "## What the servers counted\n\nGains over the sweep of the engine servers' KV "
        "transfer metrics and the gateway's routing and P/D decisions:\n\n"
        f"{servers_table(result.servers)}\n"
    )


def write_sweep_report(
    out_dir: Path, result: SweepResult, slo: Slo, about: str
) -> tuple[Path, dict[str, Any]]:
    """results.json, attainment.png and report.md in `out_dir`; returns the report's path
    and the summary."""
    summary = judge(result, slo)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(
        json.dumps(as_json(result, summary, about), indent=2) + "\n"
    )
    attainment_plot(summary, out_dir / "attainment.png")
    report = out_dir / "report.md"
    report.write_text(markdown_report(result, summary, about, slo))
    return report, summary


def as_json(result: SweepResult, summary: dict[str, Any], about: str) -> dict[str, Any]:
    return {
        "meta": {
            "scenario": "pd",
            "about": about,
            "date": result.date,
            "commit": result.commit,
            "settings": result.settings,
            "options": dataclasses.asdict(result.options),
            "rates": list(result.rates),
            "seed": result.seed,
        },
        "summary": summary,
        "servers": result.servers,
        "requests": {
            label: [
                {
                    "rate": rate,
                    "elapsed_s": result.elapsed[label][rate],
                    "records": [dataclasses.asdict(r) for r in records],
                }
                for rate, records in by_rate.items()
            ]
            for label, by_rate in result.records.items()
        },
    }


def load_result(path: Path) -> tuple[SweepResult, str]:
    """A sweep and its description from the results.json that write_sweep_report wrote."""
    data = json.loads(path.read_text())
    meta = data["meta"]
    options = {**meta["options"], "rag_tokens": tuple(meta["options"]["rag_tokens"])}
    requests = data["requests"]
    result = SweepResult(
        settings=meta["settings"],
        options=WorkloadOptions(**options),
        rates=tuple(meta["rates"]),
        seed=meta["seed"],
        records={
            label: {run["rate"]: [RequestRecord(**r) for r in run["records"]] for run in runs}
            for label, runs in requests.items()
        },
        elapsed={
            label: {run["rate"]: run["elapsed_s"] for run in runs}
            for label, runs in requests.items()
        },
        servers=data["servers"],
        date=meta["date"],
        commit=meta["commit"],
    )
    return result, meta["about"]
