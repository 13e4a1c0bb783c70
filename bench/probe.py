"""A URL's response times while something else loads the server, measured from another
process (a probe in the caller's process would wait on the caller's own load)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

# GETs the URL every 10 ms until stdin closes; says "polling" once the first GET is
# answered, then prints each wait in seconds and how many GETs failed (an error status,
# or no answer).
_PROBE = """
import json, sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
waits, failures = [], 0
with httpx.Client(timeout=120) as client:
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            ok = client.get(sys.argv[1]).is_success
        except httpx.TransportError:
            ok = False
        waits.append(time.perf_counter() - t0)
        failures += not ok
        if len(waits) == 1:
            print("polling", flush=True)
        time.sleep(0.01)
print(json.dumps({"waits": waits, "failures": failures}))
"""


@dataclass
class Probe:
    waits: list[float] = field(default_factory=list)  # seconds, filled when the block ends
    failures: int = 0


@contextlib.contextmanager
def probed(url: str) -> Iterator[Probe]:
    """GETs `url` every 10 ms from another process while the block runs (which starts
    once the probe's first GET is answered)."""
    probe = Probe()
    command = [sys.executable, "-c", _PROBE, url]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        process.stdout.readline()  # "polling"
        yield probe
    finally:
        out, _ = process.communicate(input="", timeout=300)
        result = json.loads(out)
        probe.waits.extend(result["waits"])
        probe.failures = result["failures"]
