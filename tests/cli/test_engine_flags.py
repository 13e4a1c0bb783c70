"""`semgate serve`'s engine flags, made from the engine's declared settings: one a
setting, named as it is, into the same settings the environment and config file set."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from cli.main import build_parser
from cli.serve_command import _settings
from gateway.engine_settings import EngineSettings
from gateway.settings import Settings


def _serve(*flags: str) -> Settings:
    return _settings(build_parser().parse_args(["serve", *flags]))


def test_every_engine_setting_has_its_flag():
    serve = build_parser().parse_args(["serve"])
    assert {setting.name for setting in fields(EngineSettings)} <= set(vars(serve))


def test_the_engine_flags_set_the_engine_settings(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SEMGATE_NUM_THREADS", "2")  # not a flag here: the environment's
    settings = _serve(
        "--no-prefix-caching",
        "--max-num-seqs", "8",
        "--quantization", "int8",
        "--kv-cache-memory-fraction", "0.5",
        "--enforce-eager",
        "--hang-timeout", "3",
    )  # fmt: skip
    assert settings.engine == EngineSettings(
        prefix_caching=False,
        max_num_seqs=8,
        quantization="int8",
        kv_cache_memory_fraction=0.5,
        enforce_eager=True,
        hang_timeout=3.0,
        num_threads=2,
    )


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--gpu-memory-utilization", "1.5"], "1.5 must be in (0, 1]"),
        (["--quantization", "int3"], "invalid choice: 'int3'"),
        (["--max-num-seqs", "many"], "invalid int value: 'many'"),
    ],
)
def test_a_bad_engine_flag_is_refused_by_the_parser(
    flags: list[str], error: str, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *flags])
    assert error in capsys.readouterr().err


def test_help_loads_no_torch():
    check = "import sys, cli.main; cli.main.build_parser(); print(sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True
    ).stdout
    assert "'torch'" not in loaded
