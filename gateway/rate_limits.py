"""Rate limits in three buckets that never share a budget, so no one can lock out
anyone else:

- each configured API key has its own budget (`rate_limit`); on the open gateway (no
  keys) each client address has one;
- requests with no key or an unknown one are limited per client address in a bucket
  of their own (same budget): guessing keys is slowed, and within the budget they get
  their 401 (which clients do not retry), never a tenant's or the operator's 429;
- the admin key has its own budget (`admin_rate_limit`, none by default).

Each bucket is one of Litestar's RateLimitMiddleware, applied only to the requests
its `check_throttle_handler` claims; keys are hashed before they name a bucket.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from litestar import Request
from litestar.middleware.base import DefineMiddleware
from litestar.middleware.rate_limit import RateLimitConfig, get_remote_address

from gateway.auth import Keyring, bearer_token
from gateway.settings import Settings, parse_rate

UNLIMITED_PATHS = ["/health", "/ready", "/metrics", "/schema"]

Bucket = Callable[[Keyring, str | None, Request], str | None]


def _tenant(keyring: Keyring, token: str | None, request: Request) -> str | None:
    if token is not None and keyring.is_admin(token):
        return None  # the admin key's own bucket, even on the open gateway
    if keyring.open:
        return f"addr:{get_remote_address(request)}"
    if token is not None and keyring.tenant_key(token):
        return "key:" + hashlib.sha256(token.encode()).hexdigest()[:24]
    return None


def _unknown(keyring: Keyring, token: str | None, request: Request) -> str | None:
    if keyring.open or (token is not None and keyring.known(token)):
        return None
    return f"unknown:{get_remote_address(request)}"


def _admin(keyring: Keyring, token: str | None, _: Request) -> str | None:
    return "admin" if token is not None and keyring.is_admin(token) else None


def _config(rate: tuple[str, int], bucket: Bucket) -> DefineMiddleware:
    def identify(request: Request) -> str | None:
        keyring: Keyring = request.app.state.runtime.keyring
        return bucket(keyring, bearer_token(request), request)

    async def claims(request: Request) -> bool:
        return identify(request) is not None

    config = RateLimitConfig(
        rate_limit=rate,  # type: ignore[arg-type]
        identifier_for_request=lambda request: identify(request) or "",
        check_throttle_handler=claims,
        exclude=UNLIMITED_PATHS,
    )
    return config.middleware


def rate_limit_middleware(settings: Settings) -> list[DefineMiddleware]:
    middleware = []
    if (rate := parse_rate(settings.rate_limit)) is not None:
        middleware += [_config(rate, _tenant), _config(rate, _unknown)]
    if (admin_rate := parse_rate(settings.admin_rate_limit)) is not None:
        middleware.append(_config(admin_rate, _admin))
    return middleware
