"""One cache-on gateway (embedded Redis Stack, bundled model) per test session, with
three tenants' API keys (alice and bob for tests/gateway, loadtest for tests/loadtest:
each tenant is its own cache partition) and a fixed admin key. A plugin of the root
conftest, so every test directory shares the one server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.servers import Server, caching_server, serving

ALICE, BOB, ADMIN = "sk-alice-test", "sk-bob-test", "sk-admin-test"
LOADTEST = "sk-loadtest-test"


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    keys = f"{ALICE}:alice,{BOB}:bob,{LOADTEST}:loadtest"
    flags = ["--api-keys", keys, "--admin-key", ADMIN]
    with serving(caching_server(tmp_path_factory, flags)) as [server]:
        yield server
