"""Settings from the environment: quantization, the cache TTL."""

from __future__ import annotations

import pytest

from cli.serve_command import QUANTIZATION_CHOICES as CLI_QUANTIZATION_CHOICES
from engine.config import QUANTIZATION_CHOICES
from gateway.settings import Settings


def test_quantization_comes_from_the_environment():
    assert Settings.load(env={"SEMGATE_QUANTIZATION": "int8"}).quantization == "int8"
    assert Settings.load(env={}).quantization == "auto"


def test_an_unknown_quantization_is_refused_at_start():
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8, int4"):
        Settings.load(env={"SEMGATE_QUANTIZATION": "int3"})


def test_the_cli_offers_the_engine_choices():
    assert CLI_QUANTIZATION_CHOICES == QUANTIZATION_CHOICES


@pytest.mark.parametrize("ttl", ["0", str(10**20)])
def test_a_cache_ttl_out_of_range_is_refused_at_start(ttl: str):
    with pytest.raises(ValueError, match="cache_ttl must be from 1 to 315360000 seconds"):
        Settings.load(env={"SEMGATE_CACHE_TTL": ttl})
