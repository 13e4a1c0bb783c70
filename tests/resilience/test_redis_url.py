"""Redis URLs to clients (resilience/redis_url.py): the redis+sentinel:// form parsed and
refused readably, the settings that take a URL checking it at start, and the clients it
makes talking to a real Sentinel-managed primary (tests/redis_sentinel.py)."""

from __future__ import annotations

import asyncio

import pytest

from engine.options import EngineOptions
from gateway.settings import Settings
from resilience.redis_url import (
    SentinelURL,
    async_client,
    check_redis_url,
    parse_sentinel_url,
    redacted,
    sync_client,
)
from tests.cache.fixtures import Run
from tests.redis_sentinel import SentinelCluster


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("redis+sentinel://h1:26379/mymaster/0", SentinelURL((("h1", 26379),), "mymaster", 0)),
        (
            "redis+sentinel://:secret@h1:26379,h2:26380,10.0.0.3:26381/mymaster/3",
            SentinelURL(
                (("h1", 26379), ("h2", 26380), ("10.0.0.3", 26381)), "mymaster", 3, None, "secret"
            ),
        ),
        (
            "redis+sentinel://app:p%40ss%3Aw%2Frd@[::1]:26379/cache%20one/15",
            SentinelURL((("::1", 26379),), "cache one", 15, "app", "p@ss:w/rd"),
        ),
        ("redis+sentinel://app@h:1/s/0", SentinelURL((("h", 1),), "s", 0, "app", None)),
    ],
)
def test_sentinel_urls_are_parsed(url: str, parsed: SentinelURL):
    assert parse_sentinel_url(url) == parsed
    check_redis_url(url, "redis_url")


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("redis+sentinel://h1/mymaster/0", "sentinel 'h1' is not HOST:PORT"),
        ("redis+sentinel://h1:port/mymaster/0", "sentinel 'h1:port' is not HOST:PORT"),
        ("redis+sentinel://h1:0/mymaster/0", "sentinel 'h1:0' is not HOST:PORT"),
        ("redis+sentinel://h1:65536/mymaster/0", "sentinel 'h1:65536' is not HOST:PORT"),
        ("redis+sentinel://h1:1,,h2:2/mymaster/0", "sentinel '' is not HOST:PORT"),
        ("redis+sentinel://:secret@/mymaster/0", "sentinel '' is not HOST:PORT"),
        ("redis+sentinel://h1:26379", "no SERVICE"),
        ("redis+sentinel://h1:26379//0", "no SERVICE"),
        ("redis+sentinel://h1:26379/mymaster", "DB '' is not a database number"),
        ("redis+sentinel://h1:26379/mymaster/", "DB '' is not a database number"),
        ("redis+sentinel://h1:26379/mymaster/zero", "DB 'zero' is not a database number"),
        ("redis+sentinel://h1:26379/mymaster/0/", "DB '0/' is not a database number"),
        ("redis+sentinel://h1:26379/mymaster/0?ssl=true", "no query string"),
    ],
)
def test_bad_sentinel_urls_are_refused_saying_what_is_wrong(url: str, what: str):
    with pytest.raises(ValueError) as refused:
        check_redis_url(url, "redis_url")
    message = str(refused.value)
    assert message.startswith("redis_url: Redis Sentinel URL")
    assert what in message
    assert "redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE/DB" in message


def test_messages_never_show_the_password():
    with pytest.raises(ValueError) as refused:
        check_redis_url("redis+sentinel://:hunter2@h1/mymaster/0", "redis_url")
    assert "hunter2" not in str(refused.value) and ":***@h1" in str(refused.value)
    assert redacted("redis://user:hunter2@h:6379/0") == "redis://user:***@h:6379/0"
    assert redacted("redis+sentinel://:pw@a:1,b:2/s/0") == "redis+sentinel://:***@a:1,b:2/s/0"
    assert redacted("redis://h:6379/0") == "redis://h:6379/0"


def test_redis_py_forms_pass_and_others_are_refused():
    for url in ("redis://h:6379/0", "rediss://:pw@h:6380/1", "unix:///run/redis.sock?db=2"):
        check_redis_url(url, "kv_store")
    with pytest.raises(ValueError, match=r"^kv_store: 'http://h:6379' is not a Redis URL"):
        check_redis_url("http://h:6379", "kv_store")
    with pytest.raises(ValueError, match=r"^kv_store: "):
        check_redis_url("redis://h:port/0", "kv_store")


def test_the_settings_that_take_a_url_check_it_at_start():
    with pytest.raises(ValueError, match=r"^redis_url: Redis Sentinel URL .*no SERVICE"):
        Settings(redis_url="redis+sentinel://h1:26379")
    assert Settings(redis_url="redis+sentinel://h1:26379/mymaster/0").redis_url
    with pytest.raises(ValueError, match=r"^kv_store: Redis Sentinel URL .*HOST:PORT"):
        EngineOptions(kv_store="redis+sentinel://h1/kv/0")
    assert EngineOptions(kv_store="redis+sentinel://h1:26379/kv/2").kv_store


def test_the_sync_client_writes_to_the_primary_in_the_urls_db(sentinel: SentinelCluster):
    with sync_client(sentinel.url(db=3), socket_timeout=2) as client:
        client.set("semgate:test:db", "three")
    with sentinel.primary().client(db=3) as direct:
        assert direct.get("semgate:test:db") == b"three"
    sentinel.replicated()
    with sentinel.replica().client(db=3) as copy:
        assert copy.get("semgate:test:db") == b"three"


def test_a_blocking_sentinel_pool_waits_for_a_free_connection(sentinel: SentinelCluster, run: Run):
    """One connection, two commands at once: the second waits for the first (a BLPOP that
    times out after 0.3 s) instead of failing with MaxConnectionsError."""

    async def both() -> list[object]:
        client = async_client(sentinel.url(), pool_wait=5, max_connections=1, socket_timeout=5)
        try:
            return await asyncio.gather(client.blpop(["semgate:test:empty"], 0.3), client.ping())
        finally:
            await client.aclose()

    assert run(both()) == [None, True]
