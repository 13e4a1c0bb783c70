"""Rate limits in three buckets that never share a budget, so no one can lock out
anyone else:

- each configured API key has its own budget (`rate_limit`); on the open gateway (no
  keys) each client address has one;
- requests with no key or an unknown one (and, on the open gateway too, an admin
  route's without the admin key) are limited per client address in a bucket of their
  own, with its own budget (`failed_auth_rate_limit`, 60 a minute, whatever
  `rate_limit` is, set or not): guessing keys is slowed, and within the budget they
  always get their 401 (which clients do not retry), never a tenant's or the
  operator's 429;
- the admin key has its own budget (`admin_rate_limit`, none by default).

Each bucket is one of Litestar's RateLimitMiddleware, applied only to the requests
its `check_throttle_handler` claims; keys are hashed before they name a bucket.
"""

from __future__ import annotations

import hashlib

from litestar import Request
from litestar.middleware.base import DefineMiddleware
from litestar.middleware.rate_limit import DurationUnit, RateLimitConfig, get_remote_address

from gateway.auth import Keyring, admin_guard, bearer_token
from gateway.settings import Settings, parse_rate

UNLIMITED_PATHS = ["/health", "/ready", "/metrics", "/schema"]
_BUCKET = "semgate_rate_bucket"  # in the scope's state: (kind, bucket), classified once


def bucket_of(request: Request) -> tuple[str, str]:
    """(kind, bucket) of the request: kind "tenant", "unknown" or "admin". The key is
    compared once a request (in constant time, against every configured key), whichever
    middleware asks first; the others read the scope."""
    state = request.scope.setdefault("state", {})
    if (cached := state.get(_BUCKET)) is not None:
        return cached
    keyring: Keyring = request.app.state.runtime.keyring
    token = bearer_token(request)
    if token is not None and keyring.is_admin(token):
        found = ("admin", "admin")  # its own bucket, even on the open gateway
    # On the open gateway chat needs no key, but the admin API does: its failures are
    # guesses like any other.
    elif keyring.open and admin_guard not in request.route_handler.resolve_guards():
        found = ("tenant", f"addr:{get_remote_address(request)}")
    elif token is not None and keyring.tenant_key(token):
        found = ("tenant", "key:" + hashlib.sha256(token.encode()).hexdigest()[:24])
    else:
        found = ("unknown", f"unknown:{get_remote_address(request)}")
    state[_BUCKET] = found
    return found


def _config(rate: tuple[DurationUnit, int], kind: str) -> DefineMiddleware:
    async def claims(request: Request) -> bool:
        return bucket_of(request)[0] == kind

    config = RateLimitConfig(
        rate_limit=rate,
        identifier_for_request=lambda request: bucket_of(request)[1],
        check_throttle_handler=claims,
        exclude=UNLIMITED_PATHS,
    )
    return config.middleware


def rate_limit_middleware(settings: Settings) -> list[DefineMiddleware]:
    middleware = []
    if (failed_auth_rate := parse_rate(settings.failed_auth_rate_limit)) is not None:
        middleware.append(_config(failed_auth_rate, "unknown"))
    if (rate := parse_rate(settings.rate_limit)) is not None:
        middleware.append(_config(rate, "tenant"))
    if (admin_rate := parse_rate(settings.admin_rate_limit)) is not None:
        middleware.append(_config(admin_rate, "admin"))
    return middleware
