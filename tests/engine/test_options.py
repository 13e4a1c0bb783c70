"""The engine's declared settings (engine/options.py) against what the engine has."""

from __future__ import annotations

from engine.attention_backends import BACKENDS
from engine.options import ATTENTION_BACKEND_CHOICES


def test_the_declared_attention_backends_are_the_registered_ones():
    assert ("auto", *BACKENDS) == ATTENTION_BACKEND_CHOICES
