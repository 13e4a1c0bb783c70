"""The in-process engine's section of the gateway's settings (`Settings.engine`): the
engine's own (engine/options.py) and how the gateway admits requests to it and watches
it. No torch until an engine is made: `semgate serve --help` reads these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.options import EngineOptions, option

if TYPE_CHECKING:
    from engine.config import EngineConfig


@dataclass
class EngineSettings(EngineOptions):
    """The in-process engine (unused when upstreams are given, unless `local_engine`)."""

    # Past max_num_seqs running and these waiting, 429 with Retry-After.
    max_waiting: int = option(
        256, "places in the engine's queue beyond its running slots; past them 429"
    )
    # Checked by gateway/upstream/core_supervisor.py.
    hang_timeout: float = option(
        10.0,
        "seconds the engine core may make no progress with requests pending before it is restarted",
    )

    # Linux's nice of the engine core process: when the CPU is full (a burst on a small
    # machine), the gateway's own work (HTTP, cache lookups: a few ms a request) goes
    # before the engine's steps, so a cached answer is still found in milliseconds. With
    # CPU to spare it changes nothing (docs/gateway.md, "Under a burst").
    engine_nice: int = option(
        10, "niceness of the engine core process (0-19): the gateway's own work goes first"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.engine_nice <= 19:
            raise ValueError("engine_nice must be in 0..19")
        if self.max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        if self.hang_timeout <= 0:
            raise ValueError("hang_timeout must be > 0")

    def config(self) -> EngineConfig:
        """The engine's configuration (which resolves the model and checks the rest)."""
        from engine.config import EngineConfig  # torch: loaded when an engine is made

        return EngineConfig(**self.options(), core_nice=self.engine_nice)
