"""Speculative decoding: proposers (n-gram prompt lookup, draft model) and a lossless
verifier, run inside the continuous batch. The engine builds its speculator with
engine/speculator_setup.py (over its model runner, which this package's proposers and
verifier serve)."""

from engine.speculative.speculator import Speculator

__all__ = ["Speculator"]
