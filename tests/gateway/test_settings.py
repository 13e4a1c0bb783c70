"""Settings from the environment, the config file and overrides: quantization, the cache
TTL, and the engine's section (flat names, or the config file's [engine] table)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.engine_settings import EngineSettings
from gateway.settings import Settings


def test_quantization_comes_from_the_environment():
    assert Settings.load(env={"SEMGATE_QUANTIZATION": "int8"}).engine.quantization == "int8"
    assert Settings.load(env={}).engine.quantization == "auto"


def test_an_unknown_quantization_is_refused_at_start():
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8, int4"):
        Settings.load(env={"SEMGATE_QUANTIZATION": "int3"})


def test_the_kv_cache_dtype_comes_from_the_environment_and_is_checked():
    env = {"SEMGATE_KV_CACHE_DTYPE": "float32"}
    assert Settings.load(env=env).engine.config().kv_cache_dtype == "float32"
    assert Settings.load(env={}).engine.config().kv_cache_dtype == "bfloat16"  # auto, on CPU
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32, bfloat16"):
        Settings.load(env={"SEMGATE_KV_CACHE_DTYPE": "fp8"})


@pytest.mark.parametrize("ttl", ["0", str(10**20)])
def test_a_cache_ttl_out_of_range_is_refused_at_start(ttl: str):
    with pytest.raises(ValueError, match="cache_ttl must be from 1 to 315360000 seconds"):
        Settings.load(env={"SEMGATE_CACHE_TTL": ttl})


@pytest.mark.parametrize(
    "text",
    ["threshold = 0.7\nmax_num_seqs = 8\n", "threshold = 0.7\n[engine]\nmax_num_seqs = 8\n"],
    ids=["flat", "table"],
)
def test_the_config_file_sets_the_engine_flat_or_in_its_table(tmp_path: Path, text: str):
    path = tmp_path / "semgate.toml"
    path.write_text(text)
    settings = Settings.load(path, env={})
    assert settings.threshold == 0.7
    assert settings.engine.max_num_seqs == 8
    # The environment overrides the file, and overrides (flags) the environment.
    assert Settings.load(path, env={"SEMGATE_MAX_NUM_SEQS": "16"}).engine.max_num_seqs == 16
    overridden = Settings.load(path, env={"SEMGATE_MAX_NUM_SEQS": "16"}, max_num_seqs=32)
    assert overridden.engine.max_num_seqs == 32


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("max_num_seqs = 8\n[engine]\nmax_num_seqs = 4\n", "max_num_seqs set both in"),
        ("[engine]\nthreshold = 0.7\n", r"unknown \[engine\] setting\(s\): threshold"),
        ("engine = 3\n", "must be a table"),
    ],
    ids=["twice", "not-an-engine-setting", "not-a-table"],
)
def test_a_config_file_with_a_confused_engine_section_is_refused(
    tmp_path: Path, text: str, error: str
):
    path = tmp_path / "semgate.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        Settings.load(path, env={})


def test_the_environment_and_overrides_name_engine_settings_flat():
    env = {"SEMGATE_MAX_NUM_SEQS": "8", "SEMGATE_PREFIX_CACHING": "0", "SEMGATE_MODEL": "m"}
    settings = Settings.load(env=env, max_waiting=3, num_threads=2)
    assert settings.engine == EngineSettings(
        model="m", max_num_seqs=8, prefix_caching=False, max_waiting=3, num_threads=2
    )
    assert settings.redis_max_connections == 2 * 8 + 3


def test_the_engine_settings_become_the_engine_config():
    engine = EngineSettings(
        max_num_seqs=8, chunked_prefill=False, prefix_caching=False, num_threads=2, max_waiting=3
    )
    config = engine.config()
    assert (config.max_num_seqs, config.num_threads) == (8, 2)
    assert not config.chunked_prefill and not config.prefix_caching
    assert config.model == engine.model
