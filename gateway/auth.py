"""API keys to tenants, and the separate admin key. Keys are compared in constant time
(every configured key is compared, so timing does not reveal which prefix matched) and
are never logged."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import tempfile
from pathlib import Path

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from gateway.errors import APIError

log = logging.getLogger("semgate.gateway")

OPEN_TENANT = "default"


def bearer_token(connection: ASGIConnection) -> str | None:
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _matches(token: str, key: str) -> bool:
    return hmac.compare_digest(token.encode(), key.encode())


def write_key_file(key: str) -> Path:
    """A new file holding `key`, readable by this user only (mkstemp makes it 0600)."""
    handle, path = tempfile.mkstemp(prefix="semgate-admin-key-")
    with os.fdopen(handle, "w") as file:
        file.write(key + "\n")
    return Path(path)


class Keyring:
    def __init__(self, api_keys: dict[str, str], admin_key: str | None) -> None:
        """`admin_key` None: one is generated for this run; empty: no admin API."""
        self.api_keys = dict(api_keys)
        self.generated_admin_key = admin_key is None
        self.admin_key: str | None = (
            f"sg-admin-{secrets.token_urlsafe(24)}" if admin_key is None else admin_key or None
        )
        # No key is longer: a longer token is refused before it is compared to any.
        keys = [*self.api_keys, *([self.admin_key] if self.admin_key else [])]
        self.longest = max((len(key) for key in keys), default=0)

    @property
    def open(self) -> bool:
        """No API keys configured: chat is open to anyone who can reach the port."""
        return not self.api_keys

    def tenant_key(self, token: str) -> bool:
        """Whether the token is one of the configured chat keys."""
        if len(token) > self.longest:
            return False
        return any([_matches(token, key) for key in self.api_keys])  # a list: compare all

    def is_admin(self, token: str) -> bool:
        return self.admin_key is not None and _matches(token, self.admin_key)

    def tenant_for(self, token: str | None) -> str:
        """The caller's tenant; raises 401 for a missing or unknown key."""
        if self.open:
            return OPEN_TENANT
        if token is None:
            raise APIError(
                401,
                "missing API key: send it as 'Authorization: Bearer <key>'",
                "authentication_error",
                code="missing_api_key",
            )
        if len(token) > self.longest:
            raise APIError(401, "invalid API key", "authentication_error", code="invalid_api_key")
        tenant = None
        for key, name in self.api_keys.items():
            if _matches(token, key) and tenant is None:
                tenant = name
        if tenant is None:
            raise APIError(401, "invalid API key", "authentication_error", code="invalid_api_key")
        return tenant

    def check_admin(self, token: str | None) -> None:
        """401 without a key or with an unknown one; 403 for a valid chat key (it
        authenticates, but is not allowed to administer), and for anyone where the admin
        API is off."""
        if self.admin_key is None:
            raise APIError(
                403,
                "the admin API is off on this server (it has no admin key)",
                "permission_error",
                code="admin_api_disabled",
            )
        if token is None:
            raise APIError(
                401,
                "the admin API needs the admin key: 'Authorization: Bearer <admin key>'",
                "authentication_error",
                code="missing_api_key",
            )
        if len(token) <= self.longest:  # a longer one is no key: nothing to compare
            if _matches(token, self.admin_key):
                return
            if any([_matches(token, key) for key in self.api_keys]):  # a list: compare all
                raise APIError(
                    403,
                    "this API key may not use the admin API",
                    "permission_error",
                    code="forbidden",
                )
        raise APIError(401, "invalid admin key", "authentication_error", code="invalid_api_key")


async def admin_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    connection.app.state.runtime.keyring.check_admin(bearer_token(connection))


async def api_key_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Authenticates before the body is read; the tenant goes into the request state."""
    keyring: Keyring = connection.app.state.runtime.keyring
    connection.state.tenant = keyring.tenant_for(bearer_token(connection))
