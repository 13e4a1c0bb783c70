"""The OpenAPI document against the server that publishes it: schemathesis fuzzes every
operation of a live gateway (in-process engine, cache on) with a tenant's key and the
admin key, from the document alone, and finds no server error and no disagreement:
every answer has a documented status, content type, headers and body, schema-valid
requests are accepted (but for tests/gateway/openapi_checks.py's refusals) and invalid
ones refused, and each path's OPTIONS lists its methods."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openapi_spec_validator import validate

from tests.gateway.servers import Server, caching_server, serving

pytestmark = pytest.mark.slow  # its own gateway, and a few hundred requests

ROOT = Path(__file__).resolve().parents[2]
TENANT_KEY, ADMIN_KEY = "sk-fuzz", "sk-fuzz-admin"
EXAMPLES = 40  # per operation and phase


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway of its own: the fuzzer changes thresholds and flushes the cache."""
    flags = ["--num-threads", "1", "--api-keys", f"{TENANT_KEY}:fuzz", "--admin-key", ADMIN_KEY]
    with serving(caching_server(tmp_path_factory, flags)) as [server]:
        yield server


def test_the_document_is_valid_openapi(fuzzed: Server):
    validate(httpx.get(fuzzed.url + "/schema/openapi.json").json())


def test_schemathesis_finds_no_server_error_nor_disagreement(fuzzed: Server, tmp_path: Path):
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        f'[auth.openapi.ApiKey]\nbearer = "{TENANT_KEY}"\n'
        f'[auth.openapi.AdminKey]\nbearer = "{ADMIN_KEY}"\n'
    )
    command = [
        str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config),
        "--no-color", "run", fuzzed.url + "/schema/openapi.json",
        "--checks", "all", "--exclude-checks", "positive_data_acceptance",
        "--max-examples", str(EXAMPLES), "--seed", "41", "--workers", "1",
        "--request-timeout", "120", "--continue-on-failure",
    ]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.gateway.openapi_checks",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-3000:]
