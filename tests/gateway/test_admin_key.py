"""Where the admin key comes from, on gateways in front of the fake upstream (cache off):
one generated for the run goes to a file only its user can read, never to the log, which
stays JSON with `--log-format json` (a gateway of its own: the file goes with its run);
an empty SEMGATE_ADMIN_KEY (what compose passes when it is unset; the session's
`fake_front`) means no admin API."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import httpx
import pytest

from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import Server, serving

pytestmark = pytest.mark.slow  # starts a server of its own


def test_a_generated_admin_key_is_written_to_a_private_file(fake: FakeUpstream):
    server = Server(["--upstream", fake.url, "--no-cache", "--log-format", "json"])
    with serving(server):
        lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line]
        (announced,) = [line for line in lines if "admin key for this run" in line["message"]]
        found = re.search(r"written to (\S+)", announced["message"])
        assert found is not None
        key_file = Path(found[1])
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert key not in server.log_path.read_text()
        headers = {"Authorization": f"Bearer {key}"}
        stats = httpx.get(server.url + "/admin/cache/stats", headers=headers)
        assert stats.json()["error"]["code"] == "cache_disabled"  # past the admin guard
    assert not key_file.exists()  # the key went with its run


def test_an_empty_admin_key_turns_the_admin_api_off(fake_front: Server):
    for key in ("", "sg-admin-anything"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        refused = httpx.get(fake_front.url + "/admin/cache/stats", headers=headers)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "admin_api_disabled"
    log = fake_front.log_path.read_text()  # the whole of it: other tests' lines follow
    assert "admin key for this run" not in log
    assert "the admin API is off" in log
