"""Cache entries in Redis through redisvl: one index, an exact tier and a semantic tier.

Every entry is a hash at `semgate:entry:<id>`, where the id hashes the scope, the
embedder and the normalised prompt: the exact tier is one HGETALL, and storing the
same question again in the same scope replaces the old answer instead of
duplicating it. The semantic tier is a KNN query over the index, filtered by the
scope's tags, so a tenant or model never sees another's entries.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from redis.driver_info import DriverInfo
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT
from redisvl.exceptions import RedisSearchError
from redisvl.index import AsyncSearchIndex
from redisvl.query import FilterQuery, VectorQuery
from redisvl.query.filter import FilterExpression, Tag, Text
from redisvl.schema import IndexSchema

from cache.entry import FIELDS, CacheEntry, Candidate
from cache.policy import CacheScope, normalize_prompt
from cache.thresholds import similarity_from_distance
from resilience.redis_url import async_client

PREFIX = "semgate:entry"
# The vector fields an entry may have: the English tier's and the multilingual tier's.
ENGLISH_VECTOR, MULTILINGUAL_VECTOR = "vector", "vector_multilingual"
_VECTOR_FIELDS = frozenset({ENGLISH_VECTOR.encode(), MULTILINGUAL_VECTOR.encode()})
# The longest TTL an entry may have: Redis keeps expiry as milliseconds in a signed 64-bit
# number and fails EXPIRE past it. Ten years is beyond any useful cached answer's life.
MAX_TTL = 10 * 365 * 24 * 3600
# Connections a store opens at most unless told (the gateway sizes its own from its
# concurrency); past them a command waits for a free one instead of failing.
DEFAULT_MAX_CONNECTIONS = 64
# What each connection reports with CLIENT SETINFO (the library and its version).
_DRIVER_INFO = DriverInfo()
# Only mark a hit on a key that still exists: HINCRBY on an expired key would recreate
# it as a ghost hash with no TTL and no vector.
_RECORD_HIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HINCRBY', KEYS[1], 'hits', 1) end
return nil
"""


def check_ttl(ttl: int | None, name: str = "ttl") -> None:
    """Raises ValueError unless `ttl` is None (the default TTL, or none) or 1..MAX_TTL s."""
    if ttl is not None and not 1 <= ttl <= MAX_TTL:
        raise ValueError(f"{name} must be from 1 to {MAX_TTL} seconds (10 years), got {ttl}")


def _is_missing_index(exc: Exception) -> bool:
    cause = exc.__cause__ or exc
    text = str(cause).lower()
    return any(s in text for s in ("unknown index name", "no such index", "index not found"))


@dataclass(frozen=True)
class VectorField:
    """A semantic tier's vectors in the index: the field, its size, and the tag field that
    names the embedder that made them (vectors of another embedder are never compared)."""

    name: str
    dims: int
    embedder_tag: str
    embedder_id: str


class CacheStore:
    """Redis operations of the cache; no policy, no fail-open (the facade does those).
    Entries are keyed with the English embedder's id (`embedder_id`); `vectors` are the
    semantic tiers' vector fields, the English one (`vector`) first."""

    def __init__(
        self,
        redis_url: str,
        embedder_id: str,
        dims: int,
        index_name: str = "semgate",
        socket_timeout: float = 2.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        extra_vectors: tuple[VectorField, ...] = (),
    ) -> None:
        self.url = redis_url
        self.embedder_id = embedder_id
        self.vectors = (VectorField(ENGLISH_VECTOR, dims, "embedder", embedder_id), *extra_vectors)
        # Blocking: past `max_connections` in use, a command waits (up to socket_timeout)
        # for one to be released. redis-py's default pool raises MaxConnectionsError at
        # once instead, which turned bursts of lookups into errors. A lookup waits at
        # most its own budget (the facade's timeout covers the wait).
        self.client = async_client(
            redis_url,
            max_connections=max_connections,
            pool_wait=socket_timeout,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            # Resolved once: by default each new connection looks redis-py's version up in
            # its package metadata (a file read and an email-header parse, ~1.5 ms of the
            # event loop), which in a burst that opens a few hundred connections was a
            # third of the gateway's time.
            driver_info=_DRIVER_INFO,
        )
        self.schema = IndexSchema.from_dict(
            {
                "index": {"name": index_name, "prefix": PREFIX, "storage_type": "hash"},
                "fields": [
                    {"name": "prompt", "type": "text"},
                    {"name": "response", "type": "text"},
                    # Case-sensitive: RediSearch folds tag case by default, and tenant
                    # "Acme" must never match the entries of tenant "acme".
                    *(
                        {"name": name, "type": "tag", "attrs": {"case_sensitive": True}}
                        for name in (
                            "tenant",
                            "model",
                            "context",
                            "language",
                            *(v.embedder_tag for v in self.vectors),
                        )
                    ),
                    {"name": "created", "type": "numeric", "attrs": {"sortable": True}},
                    {"name": "hits", "type": "numeric", "attrs": {"sortable": True}},
                    *(
                        {
                            "name": v.name,
                            "type": "vector",
                            "attrs": {
                                "dims": v.dims,
                                "algorithm": "hnsw",
                                "distance_metric": "cosine",
                                "datatype": "float32",
                            },
                        }
                        for v in self.vectors
                    ),
                ],
            }
        )
        self.index = AsyncSearchIndex(self.schema, redis_client=self.client)
        self._record_hit = self.client.register_script(_RECORD_HIT)

    async def connect(self) -> None:
        """Creates the index unless it exists (an existing one keeps its entries). An index
        made for other fields (an older semgate's, without a tier's vectors) is defined
        again over the same entries: RediSearch indexes them anew in the background."""
        if await self.index.exists():
            info = await self.index.info()
            fields = {_text(a[1]) for a in info.get("attributes", [])}
            if fields != set(self.schema.field_names):
                await self.index.create(overwrite=True, drop=False)
            return
        await self.index.create(overwrite=False)

    async def close(self) -> None:
        await self.client.aclose()

    def entry_id(self, scope: CacheScope, prompt: str) -> str:
        key = json.dumps(
            [scope.tenant, scope.model, scope.context, self.embedder_id, normalize_prompt(prompt)],
            ensure_ascii=False,
        )
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def key(self, entry_id: str) -> str:
        return f"{PREFIX}:{entry_id}"

    async def _indexed(self, run: Any) -> Any:
        """Runs an index query; if the index vanished (FLUSHALL, a restart without
        persistence) it is recreated and the query retried once."""
        try:
            return await run()
        except (RedisSearchError, ResponseError) as exc:
            if not _is_missing_index(exc):
                raise
        await self.index.create(overwrite=False)
        return await run()

    async def get_exact(self, entry_id: str) -> Candidate | None:
        """The exact tier: one HMGET of the entry's fields (not its vector, not its TTL)."""
        values = await self.client.hmget(self.key(entry_id), FIELDS)
        if values[0] is None:  # no prompt: no entry
            return None
        raw = dict(zip(FIELDS, values, strict=True))
        return Candidate(CacheEntry.from_fields(entry_id, raw), 1.0, "exact")

    async def search(
        self,
        scope: CacheScope,
        vector: np.ndarray,
        k: int = 3,
        field: VectorField | None = None,
        language: str | None = None,
        tier: str = "semantic",
    ) -> list[Candidate]:
        """The k nearest entries in the scope by `field`'s vectors (the English tier's by
        default), most similar first (any similarity); of one `language` only, if given."""
        # The query is sent as is and its reply read here: redis-py's and redisvl's result
        # objects took ~0.13 ms of the event loop's ~1.1 ms a lookup.
        command = _search_command(self.index.name, field or self.vectors[0], scope, k, language)
        vector_bytes = np.asarray(vector, dtype=np.float32).tobytes()
        reply = await self._indexed(lambda: self.client.execute_command(*command, vector_bytes))
        return [
            Candidate(
                CacheEntry.from_fields(doc_id.removeprefix(PREFIX + ":"), row),
                similarity_from_distance(float(row["vector_distance"])),
                tier,
            )
            for doc_id, row in _search_rows(reply)
        ]

    async def put(
        self,
        scope: CacheScope,
        prompt: str,
        response: str,
        vector: np.ndarray | None,
        ttl: int | None,
        metadata: dict[str, Any] | None = None,
        entry_id: str | None = None,
        language: str = "",
        vectors: dict[str, np.ndarray] | None = None,
    ) -> CacheEntry:
        """Stores (or replaces) the answer to `prompt` in `scope`; `ttl` in seconds, None
        for no expiry. `entry_id`, when the caller has it, is `entry_id(scope, prompt)`.
        `vector` goes to the English tier's field; `vectors`, by field name, to other
        tiers' (`language` tags the entry for them). All or nothing: raises ValueError for
        a TTL out of range before writing."""
        # A transaction does not roll back: a command that fails inside EXEC (EXPIRE of an
        # overflowing TTL) leaves the others applied, an entry without its expiry. So
        # everything a command could refuse is checked before the transaction.
        check_ttl(ttl)
        entry = CacheEntry(
            id=entry_id or self.entry_id(scope, prompt),
            prompt=prompt,
            response=response,
            tenant=scope.tenant,
            model=scope.model,
            context=scope.context,
            embedder=self.embedder_id,
            created=time.time(),
            metadata=metadata or {},
            ttl=ttl,
        )
        by_field = {f.name: f for f in self.vectors}
        mapping: dict[FieldT, EncodableT] = {**entry.to_fields(), "language": language}
        for name, value in ({ENGLISH_VECTOR: vector} | (vectors or {})).items():
            if value is not None:
                mapping[name] = np.asarray(value, dtype=np.float32).tobytes()
                mapping[by_field[name].embedder_tag] = by_field[name].embedder_id
        key = self.key(entry.id)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(key)  # a replaced entry keeps neither its old TTL nor its hit count
            pipe.hset(key, mapping=mapping)
            if ttl is not None:
                pipe.expire(key, ttl)
            await pipe.execute()
        return entry

    async def record_hit(self, entry_id: str) -> None:
        await self._record_hit(keys=[self.key(entry_id)])

    async def get(self, entry_id: str) -> CacheEntry | None:
        """One round trip: the hash and its TTL, pipelined."""
        key = self.key(entry_id)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(key)
            pipe.ttl(key)
            raw, ttl = await pipe.execute()
        if not raw.get(b"prompt"):
            return None
        entry = CacheEntry.from_fields(entry_id, _decoded(raw))
        return _with_ttl(entry, ttl)

    async def delete(self, entry_id: str) -> bool:
        return bool(await self.client.delete(self.key(entry_id)))

    def _filter(
        self, tenant: str | None, model: str | None, text: str | None = None
    ) -> FilterExpression | None:
        expr: FilterExpression | None = None
        parts = [
            Tag("tenant") == tenant if tenant else None,
            Tag("model") == model if model else None,
        ]
        words = search_words(text or "")
        if words:
            parts.append(Text("prompt") % words)
        for part in parts:
            if part is not None:
                expr = part if expr is None else expr & part
        return expr

    async def list(
        self,
        tenant: str | None = None,
        model: str | None = None,
        text: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[int, list[CacheEntry]]:
        """Entries newest first, optionally filtered by tenant, model and prompt words;
        returns (total matching, this page)."""
        query = FilterQuery(
            filter_expression=self._filter(tenant, model, text) or "*",
            return_fields=FIELDS,
            num_results=limit,
            sort_by=("created", "DESC"),
        )
        query.paging(offset, limit)
        result = await self._indexed(
            lambda: self.index.search(query.query, query_params=query.params)
        )
        entries = [
            CacheEntry.from_fields(doc.id.removeprefix(PREFIX + ":"), doc.__dict__)
            for doc in result.docs
        ]
        if entries:
            async with self.client.pipeline(transaction=False) as pipe:
                for entry in entries:
                    pipe.ttl(self.key(entry.id))
                ttls = await pipe.execute()
            entries = [_with_ttl(e, t) for e, t in zip(entries, ttls, strict=True)]
        return int(result.total), entries

    async def flush(self, tenant: str | None = None, model: str | None = None) -> int:
        """Deletes every entry, or those of one tenant and/or model; returns how many."""
        if tenant == "" or model == "":  # redisvl reads an empty tag as any tag
            raise ValueError("an empty tenant or model names no entries")
        expr = self._filter(tenant, model)
        if expr is None:
            return int(await self._indexed(self.index.clear))
        result = await self._indexed(lambda: self.index.drop_by_filter(expr))
        return int(result.processed)


def search_words(text: str) -> str:
    """The words of a search text, "" where it has none. Words only: query syntax in the
    text ("|", ")", "@tenant:") would be a syntax error or widen the filter beyond its
    tenant."""
    return " ".join(re.findall(r"\w+", text))


# Building the filter and query objects cost ~0.15 ms of the event loop a lookup, and
# they differ only by scope: redisvl writes each scope's query once.
@lru_cache(maxsize=4096)
def _search_command(
    index: str, field: VectorField, scope: CacheScope, k: int, language: str | None
) -> tuple[Any, ...]:
    """FT.SEARCH for the k nearest entries of a scope, all but the query vector's bytes."""
    scope_filter = (
        (Tag("tenant") == scope.tenant)
        & (Tag("model") == scope.model)
        & (Tag("context") == scope.context)
        & (Tag(field.embedder_tag) == field.embedder_id)
    )
    if language is not None:
        scope_filter = scope_filter & (Tag("language") == language)
    query = VectorQuery(
        vector=[0.0],  # a placeholder: the vector travels in PARAMS, appended per call
        vector_field_name=field.name,
        return_fields=FIELDS,
        filter_expression=scope_filter,
        num_results=k,
    )
    return ("FT.SEARCH", index, *query.get_args(), "PARAMS", 2, "vector")


def _search_rows(reply: Any) -> list[tuple[str, dict[str, Any]]]:
    """(key, fields) of each document in an FT.SEARCH reply, in either protocol: RESP3
    {results: [{id, extra_attributes}, ...]}, RESP2 [total, id, [field, value, ...], ...]."""
    if isinstance(reply, dict):
        docs = [(d[b"id"], d[b"extra_attributes"]) for d in reply[b"results"]]
    else:
        flat = [(reply[i], reply[i + 1]) for i in range(1, len(reply), 2)]
        docs = [(key, dict(zip(f[::2], f[1::2], strict=True))) for key, f in flat]
    return [(key.decode(), _decoded(fields)) for key, fields in docs]


def _decoded(raw: dict[bytes, bytes]) -> dict[str, Any]:
    return {k.decode(): v for k, v in raw.items() if k not in _VECTOR_FIELDS}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _with_ttl(entry: CacheEntry, ttl: int) -> CacheEntry:
    return replace(entry, ttl=None if ttl is None or ttl < 0 else int(ttl))
