"""Redis URLs to clients, in one place: redis-py's own forms (redis://, rediss://,
unix://) and `redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE/DB`, the primary that
Redis Sentinel names for SERVICE. The cache, its start-up check and the engine's KV store
all build their clients here, so each follows a failover the same way.

A Sentinel client is redis-py's own (`Sentinel.master_for`): each new connection asks the
sentinels for the primary, and when they name another one the idle connections to the
old one are dropped, so commands reach the promoted replica once Sentinel has promoted
it. The URL's user and password are the Redis servers' (as in redis:// URLs); the
sentinels are asked without them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.connection import parse_url
from redis.sentinel import Sentinel, SentinelConnectionPool

SENTINEL_SCHEME = "redis+sentinel://"
SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
SENTINEL_FORM = "redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE/DB"
_PORT = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True)
class SentinelURL:
    """A parsed `redis+sentinel://` URL: where to ask, for which primary, and how to log
    in to it."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None = None
    password: str | None = None

    def credentials(self) -> dict[str, Any]:
        """The primary's connection settings this URL gives."""
        return {"db": self.db, "username": self.username, "password": self.password}


def parse_sentinel_url(url: str) -> SentinelURL:
    """Raises ValueError, saying what is wrong and the form expected, for anything but
    exactly SENTINEL_FORM (no query string: the flags set timeouts)."""

    def bad(what: str) -> ValueError:
        return ValueError(f"Redis Sentinel URL {redacted(url)!r}: {what}; expected {SENTINEL_FORM}")

    if not url.startswith(SENTINEL_SCHEME):
        raise bad("not redis+sentinel://")
    rest = url.removeprefix(SENTINEL_SCHEME)
    if "?" in rest or "#" in rest:
        raise bad("no query string or fragment is taken")
    location, _, path = rest.partition("/")
    userinfo, at, hosts = location.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) if colon else None
    sentinels = []
    for address in hosts.split(","):
        host, _, port = address.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")  # an IPv6 address: [::1]:26379
        if not host or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
            raise bad(f"sentinel {address!r} is not HOST:PORT")
        sentinels.append((host, int(port)))
    service, _, db = path.partition("/")
    if not service:
        raise bad("no SERVICE (the name the sentinels monitor the primary by)")
    if not db.isascii() or not db.isdigit():
        raise bad(f"DB {db!r} is not a database number")
    return SentinelURL(tuple(sentinels), unquote(service), int(db), username, password)


def check_redis_url(url: str, setting: str) -> None:
    """Raises ValueError naming `setting` unless `url` is a Redis URL of a known form."""
    try:
        if url.startswith(SENTINEL_SCHEME):
            parse_sentinel_url(url)
        elif url.startswith(SCHEMES):
            parse_url(url)
        else:
            raise ValueError(f"{redacted(url)!r} is not a Redis URL ({', '.join(SCHEMES)})")
    except ValueError as exc:
        raise ValueError(f"{setting}: {exc}") from None


def redacted(url: str) -> str:
    """`url` with its password, if any, as `***` (for logs and error messages)."""
    return re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url, count=1)


def sync_client(url: str, **options: Any) -> redis.Redis:
    """A client of the Redis at `url` (for a Sentinel URL, of the primary it names);
    `options` are redis-py's connection settings (socket_timeout, ...)."""
    if not url.startswith(SENTINEL_SCHEME):
        return redis.Redis.from_url(url, **options)
    target = parse_sentinel_url(url)
    sentinel = Sentinel(target.sentinels, sentinel_kwargs=_socket_options(options))
    return sentinel.master_for(
        target.service, connection_pool_class=_ClosingSentinelPool,
        **target.credentials(), **options,
    )  # fmt: skip


def async_client(url: str, pool_wait: float | None = None, **options: Any) -> aioredis.Redis:
    """`sync_client` for asyncio. With `pool_wait`, a command that finds every one of
    `max_connections` in use waits up to that long for one (a blocking pool) instead of
    failing at once."""
    if pool_wait is not None:
        options["timeout"] = pool_wait
    if not url.startswith(SENTINEL_SCHEME):
        plain = aioredis.ConnectionPool if pool_wait is None else aioredis.BlockingConnectionPool
        return aioredis.Redis.from_pool(plain.from_url(url, **options))
    target = parse_sentinel_url(url)
    sentinel = AsyncSentinel(target.sentinels, sentinel_kwargs=_socket_options(options))
    pool = _AsyncClosingSentinelPool if pool_wait is None else _BlockingSentinelPool
    return sentinel.master_for(
        target.service, connection_pool_class=pool, **target.credentials(), **options
    )


def primary_address(client: aioredis.Redis) -> tuple[str, int] | None:
    """The primary a Sentinel client's connections last went to (None before the first,
    and for any other client)."""
    pool = client.connection_pool
    return pool.master_address if isinstance(pool, AsyncSentinelPool) else None


def _socket_options(options: dict[str, Any]) -> dict[str, Any]:
    """The sentinels' connection settings: the same timeouts as the primary's."""
    return {k: v for k, v in options.items() if k.startswith("socket_")}


# redis-py leaves the sentinels' own connections open when a master_for client closes its
# pool; these pools close them too, so a closed client leaves no socket behind.


class _ClosingSentinelPool(SentinelConnectionPool):
    def close(self) -> None:
        super().close()
        for sentinel in self.sentinel_manager.sentinels:
            sentinel.close()


class _AsyncClosingSentinelPool(AsyncSentinelPool):
    async def aclose(self) -> None:
        await super().aclose()
        await self.sentinel_manager.aclose()


class _BlockingSentinelPool(_AsyncClosingSentinelPool, aioredis.BlockingConnectionPool):
    """Sentinel's pool with BlockingConnectionPool's wait for a free connection."""
