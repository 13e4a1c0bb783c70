"""What a request allows the cache, as HTTP caching reads a request's Cache-Control."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import APIError


@dataclass(frozen=True)
class CacheDirectives:
    """`no-cache` skips the lookup (the answer is still stored), `no-store` skips both, and
    `max-age=N` accepts only cached answers at most N seconds old (0: none). How long the
    answer is kept is not Cache-Control's to say: `ttl` comes from the body's
    `cache: {"ttl": N}` (as LiteLLM spells it)."""

    lookup: bool = True
    store: bool = True
    max_age: int | None = None
    ttl: int | None = None

    @classmethod
    def parse(cls, header: str | None, ttl: int | None = None) -> CacheDirectives:
        lookup, store, max_age = True, True, None
        for part in filter(None, (p.strip().lower() for p in (header or "").split(","))):
            name, _, value = part.partition("=")
            if name == "no-cache":
                lookup = False
            elif name == "no-store":
                lookup = store = False
            elif name == "max-age":
                if not value.strip().isdigit():
                    raise APIError(400, f"Cache-Control max-age must be seconds, got {value!r}")
                max_age = int(value)
        return cls(lookup, store, max_age, ttl)
