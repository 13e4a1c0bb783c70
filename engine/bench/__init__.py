"""Benchmarks of the engine against Hugging Face transformers (`semgate bench engine`)."""

from engine.bench.engine_bench import run_engine_bench

__all__ = ["run_engine_bench"]
