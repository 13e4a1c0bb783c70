"""`semgate bench pd-threshold`: what a remote prefill costs a request, by prompt length,
to choose `--pd-min-prompt-tokens` (the gateway's default is set from it).

A remote prefill moves a prompt's compute off the decode server, which is the point of
P/D: the decode server's running streams do not stall behind it. Its cost is the
request's own: the hop to the prefill server, the wait for its save, and the decode
server's load. Below some length that cost is a large share of what computing the prompt
locally takes, and sending it away does not pay.

One run starts a prefill and a decode engine server (`semgate serve --no-cache
--kv-role prefill|decode`, one thread each) on an embedded Redis Stack, and a gateway
in front of them with `--pd-min-prompt-tokens 0` (every prompt prefilled remotely).
For each length, idle servers answer unique prompts of that length (one token each) in
turn: through the gateway (remote prefill, then load) and straight to the decode server
(local prefill), alternating which goes first; the report gives the median TTFT of both
and the overhead as a share of the local one. The default threshold is the shortest
length at which that share is at most OVERHEAD_GOAL.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.report import progress, rotated, write_report
from cache.redis_server import EmbeddedRedis
from engine.options import DEFAULT_MODEL
from gateway.serve_process import ServeProcess, serving

DEFAULT_OUT = Path("bench-results/pd-threshold.json")
LENGTHS = (64, 128, 256, 512, 1024, 2048)
QUICK_LENGTHS = (128, 512, 2048)
OVERHEAD_GOAL = 0.10  # a remote prefill may add this share of a local prefill's TTFT
ENGINE = ["--no-cache", "--num-threads", "1", "--max-model-len", "4096"]


def _prompt(tokens: int) -> str:
    """About `tokens` tokens of text no other prompt starts with (a short numbered phrase
    is about 6 tokens; the reported lengths are the servers' counts)."""
    return f"[{uuid.uuid4().hex}] " + " ".join(f"item {i} is red;" for i in range(tokens // 6))


def _ttft(client: httpx.Client, url: str, prompt: str) -> tuple[float, int]:
    """Seconds to the whole one-token answer (its first token) and the prompt's tokens."""
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 1,
        "temperature": 0,
    }
    began = time.perf_counter()
    response = client.post(url + "/v1/chat/completions", json=body, timeout=300)
    took = time.perf_counter() - began
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}: {response.text}")
    return took, response.json()["usage"]["prompt_tokens"]


def run_pd_threshold_bench(
    quick: bool = False, out_path: Path | None = DEFAULT_OUT
) -> dict[str, Any]:
    lengths, rounds = (QUICK_LENGTHS, 3) if quick else (LENGTHS, 5)
    console = Console()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as data:
        store = EmbeddedRedis(Path(data), maxmemory="2gb", persistent=False)
        url = store.start()
        prefill = ServeProcess([*ENGINE, "--kv-store", url, "--kv-role", "prefill"])
        decode = ServeProcess([*ENGINE, "--kv-store", url, "--kv-role", "decode"])
        gateway = ServeProcess(
            ["--no-cache", "--upstream", decode.url, "--upstream-prefill", prefill.url,
             "--pd-min-prompt-tokens", "0"]
        )  # fmt: skip
        try:
            with (
                serving(prefill, decode, gateway),
                httpx.Client() as client,
                progress(console) as prog,
            ):
                _ttft(client, gateway.url, _prompt(64))  # warm both paths
                _ttft(client, decode.url, _prompt(64))
                task = prog.add_task("remote against local prefill", total=len(lengths) * rounds)
                for length in lengths:
                    times: dict[str, list[float]] = {"remote": [], "local": []}
                    tokens = 0
                    for i in range(rounds):
                        for side in rotated(["remote", "local"], i):
                            target = gateway.url if side == "remote" else decode.url
                            took, tokens = _ttft(client, target, _prompt(length))
                            times[side].append(took)
                        prog.advance(task)
                    remote, local = (statistics.median(times[s]) for s in ("remote", "local"))
                    rows.append({
                        "prompt_tokens": tokens,
                        "remote_ttft_ms": remote * 1e3,
                        "local_ttft_ms": local * 1e3,
                        "overhead_share": (remote - local) / local,
                    })  # fmt: skip
        finally:
            store.stop()
    fitting = [r["prompt_tokens"] for r in rows if r["overhead_share"] <= OVERHEAD_GOAL]
    report = {
        "quick": quick,
        "overhead_goal": OVERHEAD_GOAL,
        "rows": rows,
        "threshold_tokens": min(fitting) if fitting else None,
    }
    table = Table(title="A remote prefill's cost to its request (idle servers, one thread each)")
    for column in ("prompt tokens", "remote TTFT", "local TTFT", "overhead"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r["prompt_tokens"]),
            f"{r['remote_ttft_ms']:,.0f} ms",
            f"{r['local_ttft_ms']:,.0f} ms",
            f"{r['overhead_share']:+.0%}",
        )
    console.print(table)
    console.print(f"shortest prompt whose remote overhead is <= {OVERHEAD_GOAL:.0%}: "
                  f"{report['threshold_tokens']}")  # fmt: skip
    write_report(out_path, report)
    return report
