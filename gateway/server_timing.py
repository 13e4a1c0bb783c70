"""Where a request's time went, for its client: the `Server-Timing` header (W3C Server
Timing: `name;dur=ms`, comma-separated) and the `timings` object of a stream's final
chunk. Timings are milliseconds by metric name, in the order they are reported: the
gateway's own (`cache`: the lookup, `embed`: the question's embedding within it), then
the upstream's (the engine's `queue`, `prefill` and `decode`, or what a remote server's
own Server-Timing said). They are durations, not a partition of the request: an engine
request started early runs while the cache is asked."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from typing import Any

Timings = dict[str, float]

# One header entry, quoted strings (a desc may hold commas) kept whole.
_ENTRY = re.compile(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+')
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def header(timings: Mapping[str, float]) -> str:
    """`Server-Timing`'s value: `cache;dur=3.1, queue;dur=12.0, ...`."""
    return ", ".join(f"{name};dur={ms:.1f}" for name, ms in timings.items())


def rounded(timings: Mapping[str, float]) -> Timings:
    """As the header gives them: to a tenth of a millisecond."""
    return {name: round(ms, 1) for name, ms in timings.items()}


def parse(value: str) -> Timings:
    """An upstream's `Server-Timing`: each metric that has a duration (the first `dur`
    of its entry, as browsers read it); metrics without one carry nothing to pass on."""
    timings: Timings = {}
    for entry in _ENTRY.findall(value):
        name, *params = (part.strip() for part in _QUOTED.sub('""', entry).split(";"))
        for param in params:
            key, _, number = param.partition("=")
            if key.strip().lower() != "dur":
                continue
            with contextlib.suppress(ValueError):
                ms = float(number.strip())
                if name and math.isfinite(ms):
                    timings[name] = ms
            break
    return timings


def merge(own: Mapping[str, float], upstream: Mapping[str, float] | None) -> Timings:
    """The gateway's own timings, then the upstream's; an upstream metric named like one
    of ours (a caching gateway upstream has its own `cache`) is passed as `upstream-NAME`."""
    merged = dict(own)
    for name, ms in (upstream or {}).items():
        merged[f"upstream-{name}" if name in own else name] = ms
    return merged


def seconds_to_ms(**phases: float | None) -> Timings:
    """Phases measured in seconds, as timings; those not measured (None) left out."""
    return {name: s * 1000 for name, s in phases.items() if s is not None}


# llama-server's last chunk has a `timings` object too, where counts (`prompt_n`,
# `cache_n`), rates (`*_per_second`) and per-token means sit beside its two durations:
# those pass, under the names semgate's engine gives the same phases.
_LLAMA_CPP_DURATIONS = {"prompt_ms": "prefill", "predicted_ms": "decode"}


def of_chunk(chunk: Mapping[str, Any]) -> Timings:
    """A stream chunk's `timings` (semgate's last chunk's: milliseconds by name, or
    llama-server's, of which the durations), their finite numbers only."""
    timings = chunk.get("timings")
    if not isinstance(timings, dict):
        return {}
    if "predicted_n" in timings or "prompt_n" in timings:  # llama-server's
        timings = {
            name: timings[key] for key, name in _LLAMA_CPP_DURATIONS.items() if key in timings
        }
    return {
        str(name): float(ms)
        for name, ms in timings.items()
        if isinstance(ms, int | float) and not isinstance(ms, bool) and math.isfinite(ms)
    }
