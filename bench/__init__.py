"""Benchmarks and offline tools, run by `semgate bench ...` and `semgate cache ...`:
the engine against transformers and llama.cpp, speculative decoding, weight quality,
the cache and the gateway, and the guard's calibration. Nothing that serves imports it.

Each module is imported on its own (a bench pulls in only what it measures)."""
