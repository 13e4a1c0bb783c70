"""Settings per upstream group (gateway/upstream/group_settings.py): the gateway-wide
defaults, each group's own values from flags, the environment and the config file, merged
value by value, checked at start, and what the upstreams are built with."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import serve_command
from cli.main import build_parser
from cli.serve_command import _settings
from gateway.metrics import GatewayMetrics
from gateway.runtime import build_upstream
from gateway.settings import Settings
from gateway.upstream.balancer import POLICIES, BalancerConfig
from gateway.upstream.group_settings import GroupSettings
from gateway.upstream.http import HttpUpstream

LLAMA, QWEN = "llama-3-8b", "qwen:7b"  # a colon in a model name, as Ollama's


def cli_settings(*argv: str) -> Settings:
    return _settings(build_parser().parse_args(["serve", *argv]))


def test_the_cli_offers_the_routing_policies():
    assert serve_command.ROUTING_POLICIES == POLICIES


def test_defaults_then_a_groups_own_values_from_flags():
    settings = cli_settings(
        "--upstream", f"{LLAMA}=http://a:8000,http://b:8000",
        "--upstream", f"{QWEN}=http://c:8000",
        "--upstream", "http://d:8000",
        "--upstream-policy", "least_load", "--upstream-balance-threshold", "3",
        "--upstream-timeout", "30", "--upstream-api-key", "sk-all",
        "--no-upstream-session-affinity", "--upstream-prefix-capacity", "1000",
        "--upstream-setting", f"{LLAMA}:policy=prefix",
        "--upstream-setting", f"{LLAMA}:weights=2,1",
        "--upstream-setting", f"{QWEN}:api_key=sk-qwen;{QWEN}:session_affinity=on",
        "--upstream-header",
    )  # fmt: skip
    defaults = BalancerConfig("least_load", 3.0, False, 1000)
    assert settings.group(None) == GroupSettings(defaults, 30.0, "sk-all")
    assert settings.group(LLAMA) == GroupSettings(
        BalancerConfig("prefix", 3.0, False, 1000), 30.0, "sk-all", [2.0, 1.0]
    )
    qwen = settings.group(QWEN)
    assert qwen.api_key == "sk-qwen" and qwen.balancer.session_affinity
    assert settings.upstream_header


def test_the_built_upstreams_get_their_groups_settings():
    settings = cli_settings(
        "--upstream", f"{LLAMA}=http://a:8000,http://b:8000",
        "--upstream", "http://d:8000",
        "--upstream-setting", f"{LLAMA}:policy=round_robin",
        "--upstream-setting", f"{LLAMA}:weights=3,1",
        "--upstream-setting", f"{LLAMA}:timeout=7",
    )  # fmt: skip
    metrics = GatewayMetrics(lambda: None, lambda: None, lambda: None, list)
    llama, discovered = build_upstream(settings, metrics).targets
    assert isinstance(llama, HttpUpstream) and isinstance(discovered, HttpUpstream)
    assert llama.balancer.config.policy == "round_robin"
    assert [h.weight for h in llama.health()] == [3.0, 1.0]
    assert llama._timeout == 7.0
    assert discovered.balancer.config == BalancerConfig()  # prefix, by default
    assert [h.policy for h in discovered.health()] == ["prefix"]


def test_a_groups_settings_from_the_environment():
    env = {
        "SEMGATE_UPSTREAMS": f"{LLAMA}=http://a:8000,http://b:8000",
        "SEMGATE_UPSTREAM_POLICY": "round_robin",
        "SEMGATE_UPSTREAM_SETTINGS": f"{LLAMA}:timeout=5; {LLAMA}:balance_threshold=0",
    }
    group = Settings.load(env=env).group(LLAMA)
    assert (group.balancer.policy, group.balancer.balance_threshold, group.timeout) == (
        "round_robin",
        0.0,
        5.0,
    )


def test_a_groups_table_in_the_config_file_and_a_flag_changing_one_value(tmp_path: Path):
    path = tmp_path / "semgate.toml"
    path.write_text(
        'upstream_policy = "least_load"\n'
        f'[upstreams."{LLAMA}"]\n'
        'urls = ["http://a:8000", "http://b:8000"]\n'
        'policy = "prefix"\nweights = [1, 3]\napi_key = "sk-llama"\ntimeout = 60\n'
        f'[upstreams."{QWEN}"]\nurls = "http://c:8000"\n'
    )
    settings = Settings.load(path, env={})
    assert settings.upstream_groups[LLAMA] == ["http://a:8000", "http://b:8000"]
    llama = settings.group(LLAMA)
    assert (llama.balancer.policy, llama.weights, llama.api_key, llama.timeout) == (
        "prefix",
        [1.0, 3.0],
        "sk-llama",
        60.0,
    )
    assert settings.group(QWEN).balancer.policy == "least_load"
    # A flag changes one value; the file's others stay.
    flagged = cli_settings("--config", str(path), "--upstream-setting", f"{LLAMA}:timeout=9")
    assert (flagged.group(LLAMA).timeout, flagged.group(LLAMA).weights) == (9.0, [1.0, 3.0])


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--upstream-setting", f"{LLAMA}=prefix"], "must look like MODEL:NAME=VALUE"),
        (["--upstream-setting", f"{LLAMA}:colour=red"], "unknown upstream group setting 'colour'"),
        (["--upstream-setting", f"{LLAMA}:weights=1"], "1 weight.s. for 2 URL.s."),
        (["--upstream-setting", f"{LLAMA}:weights=1,0"], "weights must be > 0"),
        (["--upstream-setting", f"{LLAMA}:timeout=soon"], "timeout='soon'"),
        (["--upstream-setting", f"{LLAMA}:policy=random"], "policy must be one of"),
        (["--upstream-setting", f"{QWEN}:policy=prefix"], "which no upstream group serves"),
        (["--upstream-balance-threshold", "-1"], "balance_threshold must be >= 0"),
    ],
    ids=["no-name", "unknown", "weights-count", "weight-zero", "not-a-number",
         "bad-policy", "no-such-group", "negative-threshold"],
)  # fmt: skip
def test_bad_group_settings_are_refused_at_start(argv: list[str], error: str):
    with pytest.raises(ValueError, match=error):
        cli_settings("--upstream", f"{LLAMA}=http://a:8000,http://b:8000", *argv)


def test_a_config_files_bad_group_setting_names_the_file(tmp_path: Path):
    path = tmp_path / "semgate.toml"
    path.write_text(f'[upstreams."{LLAMA}"]\nurls = ["http://a:8000"]\nweights = "2"\n')
    with pytest.raises(ValueError, match=rf"semgate\.toml: upstreams: {LLAMA}\.weights must be"):
        Settings.load(path, env={})
