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
from pathlib import Path

import httpx
import pytest
import schemathesis
from openapi_spec_validator import validate
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.gateway.conftest import FUZZ_KEY, chat_body
from tests.gateway.fixtures import ADMIN, ALICE
from tests.gateway.servers import MODEL, Server

pytestmark = pytest.mark.slow  # a few hundred requests

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = 40  # per operation and phase


@pytest.fixture
def fuzzed(bounded_gateway: Server) -> Server:
    """The session's bounded gateway: the fuzzer changes thresholds and flushes the cache,
    which the session's gateway keeps for its tests."""
    return bounded_gateway


def test_the_document_is_valid_openapi(fuzzed: Server):
    validate(httpx.get(fuzzed.url + "/schema/openapi.json").json())


STREAMED = {
    "/v1/chat/completions": chat_body("Say yes.", max_tokens=4),
    "/v1/completions": {"model": MODEL, "prompt": "Say", "max_tokens": 4, "echo": True},
}


@pytest.mark.parametrize("path", list(STREAMED))
def test_each_event_of_a_stream_is_what_the_document_says(gateway: Server, path: str):
    """schemathesis' own check, event by event: the role (or the echoed prompt), the
    deltas, the finish, the usage with the timings, and [DONE]. (Each stream was declared
    a string, which no event is: ST108.)"""
    schema = schemathesis.openapi.from_url(gateway.url + "/schema/openapi.json")
    body = {**STREAMED[path], "stream": True, "stream_options": {"include_usage": True}}
    case = schema[path]["POST"].Case(body=body)
    response = case.call(headers={"Authorization": f"Bearer {ALICE}"}, timeout=120)
    assert response.headers["content-type"][0].startswith("text/event-stream")
    assert response.text.count("data: ") >= 5
    case.validate_response(response, checks=[response_schema_conformance])


def test_schemathesis_finds_no_server_error_nor_disagreement(fuzzed: Server, tmp_path: Path):
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        f'[auth.openapi.ApiKey]\nbearer = "{FUZZ_KEY}"\n'
        f'[auth.openapi.AdminKey]\nbearer = "{ADMIN}"\n'
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
