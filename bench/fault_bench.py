"""`semgate bench faults`: what issue 38's faults cost, on real `semgate serve` processes
(cache on, embedded Redis, one engine thread).

1. /health's worst wait, probed from another process every 10 ms, while one client
   sends a 100 MB header, and while one sends 100,000 empty messages (3.3 MB). With
   `--baseline DIR` a server of that checkout gets the same trials, alternating with
   this one's, and the medians of both are reported.
2. A killed engine core (`kill -9`): seconds until /ready is 200 again, beside the
   core's own load time (its "engine ready in" line); a cached answer is asked for
   while it is down.
3. SIGTERM with five streams in flight (each asked for 4,000 tokens, more than the
   grace lets them finish): how each stream ends, and whether the log has a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.probe import probed
from bench.report import median, write_report
from engine.options import DEFAULT_MODEL
from gateway.serve_process import ServeProcess, serving

console = Console(stderr=True)

DEFAULT_OUT = Path("bench-results/faults.json")
KEY, ADMIN_KEY = "sk-faults", "sk-faults-admin"
HEADER_BYTES = 100 << 20
EMPTY_MESSAGES = 100_000
GRACE_S = 3
STREAMS = 5
SEED = {"question": "What survives a dead engine?", "answer": "The cache.", "tenant": "faults"}


def worst_health_wait(server: ServeProcess, work: Callable[[ServeProcess], str]) -> dict[str, Any]:
    """`work` while a probe process polls /health: its worst wait, and what work saw."""
    with probed(server.url + "/health") as probe:
        t0 = time.perf_counter()
        outcome = work(server)
        seconds = time.perf_counter() - t0
        time.sleep(0.3)
    return {
        "worst_ms": max(probe.waits) * 1000,
        "failed_probes": probe.failures,
        "answered_s": seconds,
        "answer": outcome,
    }


def big_header(server: ServeProcess) -> str:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(300)
        head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * HEADER_BYTES
        with contextlib.suppress(OSError):  # answered and closed before reading it all
            sock.sendall(head + b"\r\n\r\n")
        try:
            return sock.recv(64).split(b"\r\n")[0].decode()
        except OSError as exc:
            return repr(exc)


def empty_messages(server: ServeProcess) -> str:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": ""}] * EMPTY_MESSAGES}
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=300)
    return f"HTTP {r.status_code}"


def core_pid(server: ServeProcess) -> int:
    assert server.proc is not None
    tasks = Path(f"/proc/{server.proc.pid}/task")
    children = [int(p) for f in tasks.glob("*/children") for p in f.read_text().split()]
    return next(p for p in children if b"core_process" in Path(f"/proc/{p}/cmdline").read_bytes())


def killed_core(server: ServeProcess) -> dict[str, Any]:
    """Seconds from `kill -9` of the core to /ready 200, and the restarted core's load."""
    ask = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": SEED["question"]}]}
    headers = {"Authorization": f"Bearer {KEY}"}
    os.kill(core_pid(server), signal.SIGKILL)
    t0 = time.perf_counter()
    while httpx.get(server.url + "/ready").status_code == 200:
        time.sleep(0.01)
    hit = httpx.post(server.url + "/v1/chat/completions", json=ask, headers=headers, timeout=60)
    while httpx.get(server.url + "/ready").status_code != 200:
        time.sleep(0.05)
    back = time.perf_counter() - t0
    loads = [float(s) for s in re.findall(r"engine ready in ([\d.]+)s", server.log())]
    return {
        "back_s": back,
        "load_s": loads[-1],
        "hit_while_down": f"HTTP {hit.status_code} {hit.headers.get('x-cache-status')}",
    }


def sigterm_with_streams(server: ServeProcess) -> dict[str, Any]:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Tell a story."}],
            "max_tokens": 4000, "ignore_eos": True, "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}", "Cache-Control": "no-store"}
    ends: list[str] = []
    going = threading.Barrier(STREAMS + 1)

    def read() -> None:
        lines: list[str] = []
        try:
            url = server.url + "/v1/chat/completions"
            with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as r:
                for line in r.iter_lines():
                    if not line:
                        continue
                    lines.append(line)
                    if len(lines) == 2:  # the role chunk, then the first content chunk
                        going.wait()
            ends.append("error event, [DONE]" if _errored(lines) else _last(lines))
        except (httpx.HTTPError, threading.BrokenBarrierError) as exc:
            ends.append(type(exc).__name__)

    threads = [threading.Thread(target=read) for _ in range(STREAMS)]
    for thread in threads:
        thread.start()
    going.wait(120)
    assert server.proc is not None
    t0 = time.perf_counter()
    server.proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(180)
    code = server.proc.wait(180)
    log = server.log()
    return {
        "streams": {end: ends.count(end) for end in sorted(set(ends))},
        "exit_s": time.perf_counter() - t0,
        "exit_status": code,
        "tracebacks": log.count("Traceback"),
    }


def _errored(lines: list[str]) -> bool:
    return len(lines) >= 2 and lines[-1] == "data: [DONE]" and '"error"' in lines[-2]


def _last(lines: list[str]) -> str:
    return "[DONE]" if lines and lines[-1] == "data: [DONE]" else "cut (no [DONE])"


def _server(redis_dir: Path, checkout: Path | None = None) -> ServeProcess:
    args = ["--redis-data-dir", str(redis_dir), "--num-threads", "1", "--api-keys",
            f"{KEY}:faults", "--admin-key", ADMIN_KEY]  # fmt: skip
    if checkout is None:
        args += ["--shutdown-grace", str(GRACE_S)]
    return ServeProcess(args, checkout=checkout)


def run_fault_bench(
    quick: bool = False, out_path: Path | None = DEFAULT_OUT, baseline: Path | None = None
) -> dict[str, Any]:
    trials = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix="semgate-faults-") as tmp:
        servers = {"this": _server(Path(tmp) / "this")}
        if baseline is not None:
            servers["baseline"] = _server(Path(tmp) / "baseline", baseline)
        report: dict[str, Any] = {"trials": trials, "baseline": str(baseline or "")}
        with serving(*servers.values()):
            for name, work in (("100 MB header", big_header),
                               ("100,000 empty messages", empty_messages)):  # fmt: skip
                runs: dict[str, list[dict[str, Any]]] = {side: [] for side in servers}
                for _ in range(trials):
                    for side, server in servers.items():
                        console.print(f"{name}: {side}")
                        runs[side].append(worst_health_wait(server, work))
                report[name] = {
                    side: {"worst_ms_median": median([r["worst_ms"] for r in rs]), "runs": rs}
                    for side, rs in runs.items()
                }
            this = servers["this"]
            admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
            seeded = httpx.post(
                this.url + "/admin/cache/entries", json=SEED, headers=admin, timeout=60
            )
            seeded.raise_for_status()
            report["killed core"] = killed_core(this)
            for side, server in servers.items():
                report[f"SIGTERM ({side})"] = sigterm_with_streams(server)
    _print(report, list(servers))
    write_report(out_path, report)
    return report


def _print(report: dict[str, Any], sides: list[str]) -> None:
    table = Table(title="faults (/health's worst wait: median of the trials)")
    for column in ("measure", *sides):
        table.add_column(column)
    for name in ("100 MB header", "100,000 empty messages"):
        cells = []
        for side in sides:
            r = report[name][side]
            answer = r["runs"][0]["answer"]
            cells.append(f"{r['worst_ms_median']:.1f} ms ({answer})")
        table.add_row(f"/health during a {name}", *cells)
    core = report["killed core"]
    table.add_row(
        "killed core back (its load)",
        f"{core['back_s']:.1f} s ({core['load_s']:.1f} s); hit while down: "
        f"{core['hit_while_down']}",
        *["" for _ in sides[1:]],
    )
    table.add_row(
        f"SIGTERM, {STREAMS} streams in flight",
        *[_sigterm_cell(report[f"SIGTERM ({side})"]) for side in sides],
    )
    console.print(table)


def _sigterm_cell(r: dict[str, Any]) -> str:
    streams = ", ".join(f"{n} {end}" for end, n in r["streams"].items())
    return (f"{streams}; exit {r['exit_status']} after {r['exit_s']:.1f} s; "
            f"{r['tracebacks']} tracebacks")  # fmt: skip
