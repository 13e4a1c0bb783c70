"""The admin API under /admin (admin key required): the similarity threshold, cache
stats, entries (list, seed, delete, flush), dry-run lookups, the engine's stats and the
upstream servers' routing state."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
from litestar import Request, Response, Router, delete, get, post, put, route
from litestar.handlers import HTTPRouteHandler
from litestar.params import Parameter
from msgspec import Meta
from redis.exceptions import RedisError
from redisvl.exceptions import RedisVLError

from cache import CacheRequest, SemanticCache, Thresholds
from cache.shared_admin import SharedAdmin
from cache.store import search_words
from gateway.admin_schemas import (
    CandidateView,
    EntryPage,
    EntryView,
    Flushed,
    GuardView,
    HitView,
    LookupView,
)
from gateway.auth import admin_guard
from gateway.errors import CONTEXT_LENGTH_EXCEEDED, APIError, error_response
from gateway.job_translation import flatten_messages
from gateway.openapi_docs import error_responses
from gateway.request_fields import TAG_PATTERN, NonBlank, Similarity, Tag, Temperature, Ttl
from gateway.routes.admin_engine import engine_stats
from gateway.routes.admin_upstreams import upstreams
from gateway.runtime import Runtime
from gateway.schemas import ErrorResponse, TextMessage
from gateway.strict_json import StrictJSON
from gateway.tokens import TokenCounter, token_counter

MAX_PAGE = 500
MISSING_SCOPE = "missing_scope"  # a flush that names no entries
MAX_OFFSET = 1_000_000  # RediSearch's MAXSEARCHRESULTS: a page may start there at most
ADMIN_ERRORS = error_responses(400, 401, 403, 404, 429, 503)
ADMIN_BODY_ERRORS = error_responses(400, 401, 403, 404, 415, 429, 503)  # a JSON body's


class ThresholdConfig(msgspec.Struct):
    """Similarities in [0, 1]. A tenant override wins over a model override, which wins
    over the default."""

    default: float
    per_model: dict[str, float]
    per_tenant: dict[str, float]


# Admin bodies refuse unknown fields (400 `unknown_parameter`; the document says
# `additionalProperties: false`): a misspelt one would otherwise change nothing and
# answer 200. Values out of range are 400s naming the field, from decoding
# (gateway/request_fields.py).
class ThresholdUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """Fields left out keep their value; a table given replaces that whole table."""

    default: Similarity | None = None
    per_model: dict[str, Similarity] | None = None
    per_tenant: dict[str, Similarity] | None = None


class SeedEntry(msgspec.Struct, forbid_unknown_fields=True):
    question: NonBlank
    answer: NonBlank
    model: Tag | None = None  # default: the first served model
    tenant: Tag = "default"
    context: list[TextMessage] = msgspec.field(default_factory=list)  # earlier turns
    ttl: Ttl | None = None  # default: the cache TTL


class LookupRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Either `messages` (as in a chat request) or a one-turn `question`."""

    # As the OpenAPI document says it (gateway/openapi_docs.py): one of them, not both.
    schema_rules: ClassVar[dict[str, Any]] = {
        "oneOf": [
            {"required": [given], "properties": {given: {"not": {"type": "null"}},
                                                 other: {"type": "null"}}}
            for given, other in (("messages", "question"), ("question", "messages"))
        ]
    }  # fmt: skip
    model: Tag | None = None
    messages: Annotated[list[TextMessage], Meta(min_length=1)] | None = None
    question: NonBlank | None = None
    tenant: Tag = "default"
    temperature: Temperature = 0.0
    threshold: Similarity | None = None  # try another without changing the server's


def _cache(runtime: Runtime) -> SemanticCache:
    if not runtime.cache_on:
        raise APIError(400, "the cache is off on this server (--no-cache)", code="cache_disabled")
    reason = runtime.cache_down_reason()
    if runtime.cache is None:
        raise APIError(503, f"the cache is not ready yet: {reason}", "service_unavailable",
                       "cache_unavailable", retry_after=2)  # fmt: skip
    if reason is not None:
        raise _redis_down(reason)
    return runtime.cache


def _shared(runtime: Runtime) -> SharedAdmin:
    _cache(runtime)
    assert runtime.shared is not None  # set with the cache
    return runtime.shared


def _redis_down(reason: str) -> APIError:
    return APIError(503, f"Redis is down: {reason}; retry shortly", "service_unavailable",
                    "cache_unavailable", retry_after=2)  # fmt: skip


def _redis_failed(_: Request[Any, Any, Any], exc: Exception) -> Response[ErrorResponse]:
    """Redis lost, hanging or refusing after `_cache` found it up (the supervisor or the
    circuit breaker notices within a moment): 503, never a 500."""
    return error_response(_redis_down(f"{type(exc).__name__}: {exc}"))


# The document states the pattern; `_tag` checks it, with a 400 naming the parameter.
_TAG_PARAMETER = Parameter(default=None, schema_extra={"pattern": TAG_PATTERN})


def _tag(value: str | None, param: str) -> str | None:
    """A tenant or model as a filter: None where empty (`?tenant=` is a script's unset
    variable: it names nothing, and must not widen a flush to every tenant); 400 for
    control characters (a NUL ends the query that Redis parses)."""
    if value is not None and any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise APIError(400, f"{param} must not contain control characters", param=param)
    return value or None


def _words(q: str | None) -> str | None:
    """The words of a search, None where `q` is empty; 400 where `q` has no word to
    search (`q=?!` would otherwise list every entry)."""
    if not q:
        return None
    if not (words := search_words(q)):
        raise APIError(400, "q has no word to search for", param="q")
    return words


def _model(runtime: Runtime, model: str | None, param: str = "model") -> str:
    """The model named, as the cache partitions it (an alias: its target; 404 unless
    this gateway serves it), else the first served."""
    if model is not None:
        return runtime.upstream.route(model, param)
    if not (models := runtime.upstream.models()):
        raise APIError(503, "no model is ready yet", "service_unavailable", retry_after=2)
    return models[0]


def _thresholds(t: Thresholds) -> ThresholdConfig:
    return ThresholdConfig(t.default, dict(t.per_model), dict(t.per_tenant))


@get("/cache/threshold", summary="The similarity thresholds in force", responses=ADMIN_ERRORS)
async def get_threshold(runtime: Runtime) -> ThresholdConfig:
    return _thresholds(_cache(runtime).thresholds)


@put("/cache/threshold", summary="Change the thresholds (from the next request on)",
     dto=StrictJSON[ThresholdUpdate], return_dto=None, responses=ADMIN_BODY_ERRORS)  # fmt: skip
async def put_threshold(data: ThresholdUpdate, runtime: Runtime) -> ThresholdConfig:
    cache = _cache(runtime)
    # By served name, as the cache partitions (an alias's threshold is its target's).
    per_model = {
        _model(runtime, model, param=f"per_model.{model}"): value
        for model, value in (data.per_model or {}).items()
    }
    old = cache.thresholds
    new = Thresholds(
        old.default if data.default is None else data.default,
        dict(old.per_model if data.per_model is None else per_model),
        dict(old.per_tenant if data.per_tenant is None else data.per_tenant),
    )
    await _shared(runtime).set_thresholds(new)  # every replica applies it within a second
    return _thresholds(new)


@get(
    "/cache/stats",
    summary="Cache counters of every replica added up, and how many reported",
    responses=ADMIN_ERRORS,
)
async def stats(runtime: Runtime) -> dict[str, Any]:
    return await _shared(runtime).stats()


@get(
    "/cache/entries",
    summary="List entries, newest first (filter by tenant, model, words)",
    responses=ADMIN_ERRORS,
)
async def list_entries(
    runtime: Runtime,
    tenant: str | None = _TAG_PARAMETER,
    model: str | None = _TAG_PARAMETER,
    q: str | None = Parameter(
        default=None, description="words in the question", schema_extra={"pattern": r"^$|\w"}
    ),
    # The bound twice: Litestar leaves a bound of 0 out of the document (see
    # gateway/openapi_docs.py), and struct_schemas reaches bodies, not query parameters.
    offset: int = Parameter(default=0, ge=0, le=MAX_OFFSET, schema_extra={"minimum": 0}),
    limit: int = Parameter(default=50, ge=1, le=MAX_PAGE),
) -> EntryPage:
    tenant, model = _tag(tenant, "tenant"), _tag(model, "model")
    total, entries = await _cache(runtime).store.list(tenant, model, _words(q), offset, limit)
    return EntryPage(total, offset, [EntryView.of(e) for e in entries])


@post("/cache/entries", summary="Seed a question and its answer", status_code=201,
      dto=StrictJSON[SeedEntry], return_dto=None, responses=ADMIN_BODY_ERRORS)  # fmt: skip
async def seed_entry(data: SeedEntry, runtime: Runtime) -> EntryView:
    cache = _cache(runtime)
    model = _model(runtime, data.model)
    context = flatten_messages(data.context) if data.context else []
    counter = token_counter(runtime.upstream, model)
    prompt = [*context, {"role": "user", "content": data.question}]
    try:
        # Counted as the engine counts a generated answer's usage, which is stored with it:
        # the entry then serves only requests whose max_tokens it fits.
        usage = None
        if counter is not None:
            limit = runtime.context_length(model)
            if limit is not None:
                _refuse_too_long(counter, prompt, data.answer, limit)
            usage = {
                "prompt_tokens": await counter.prompt(prompt),
                "completion_tokens": await counter.completion(data.answer),
            }
            if limit is not None and sum(usage.values()) > limit:
                raise _too_long(sum(usage.values()), limit)
        entry = await cache.seed(
            data.question, data.answer, model, data.tenant, context, data.ttl, usage
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc
    return EntryView.of(entry)


def _refuse_too_long(
    counter: TokenCounter, prompt: list[dict[str, str]], answer: str, limit: int
) -> None:
    """400 for a seed too long by its length alone (a bound from the longest token),
    before tokenizing it costs anything."""
    chars = len(answer) + sum(len(m["content"]) for m in prompt)
    if (at_least := counter.tokenizer.min_tokens(chars)) > limit:
        raise _too_long(at_least, limit, at_least=True)


def _too_long(tokens: int, limit: int, at_least: bool = False) -> APIError:
    count = f"at least {tokens}" if at_least else str(tokens)
    return APIError(
        400,
        f"This model's maximum context length is {limit} tokens; the question and answer "
        f"({count} tokens) do not fit, so the model could never have given this answer.",
        code=CONTEXT_LENGTH_EXCEEDED,
        param="answer",
    )


@get("/cache/entries/{entry_id:str}", summary="One entry", responses=ADMIN_ERRORS)
async def get_entry(entry_id: str, runtime: Runtime) -> EntryView:
    entry = await _cache(runtime).store.get(entry_id)
    if entry is None:
        raise APIError(404, f"no cache entry {entry_id!r}", param="entry_id", code="not_found")
    return EntryView.of(entry)


@delete(
    "/cache/entries/{entry_id:str}",
    summary="Delete one entry",
    status_code=204,
    responses=ADMIN_ERRORS,
)
async def delete_entry(entry_id: str, runtime: Runtime) -> None:
    if not await _cache(runtime).store.delete(entry_id):
        raise APIError(404, f"no cache entry {entry_id!r}", param="entry_id", code="not_found")


@delete("/cache", summary="Flush one tenant's and/or model's entries, or all with all=true",
        description="With neither a filter nor all=true, a 400 (`missing_scope`) and nothing "
        "flushed.", status_code=200, responses=ADMIN_ERRORS)  # fmt: skip
async def flush(
    runtime: Runtime,
    tenant: str | None = _TAG_PARAMETER,
    model: str | None = _TAG_PARAMETER,
    everything: bool = Parameter(
        query="all", default=False, description="without a filter: flush every entry"
    ),
) -> Flushed:
    tenant, model = _tag(tenant, "tenant"), _tag(model, "model")
    # Said explicitly: `DELETE /admin/cache/entries/..` reaches this route as
    # `DELETE /admin/cache` once curl or httpx resolve the dots, and must not flush it all.
    if not everything and tenant is None and model is None:
        raise APIError(400, "say which entries: tenant and/or model, or all=true for every "
                       "entry", param="all", code=MISSING_SCOPE)  # fmt: skip
    return Flushed(await _cache(runtime).store.flush(tenant, model))


@post("/cache/lookup", summary="Dry run: would this request hit, and why (not)?", status_code=200,
      dto=StrictJSON[LookupRequest], return_dto=None, responses=ADMIN_BODY_ERRORS)  # fmt: skip
async def lookup(data: LookupRequest, runtime: Runtime) -> LookupView:
    cache = _cache(runtime)
    if (data.messages is None) == (data.question is None):
        raise APIError(400, "give `messages` or `question`, not both", param="question")
    if data.messages is not None:
        messages = flatten_messages(data.messages)
    else:
        assert data.question is not None  # one of the two is given (checked above)
        messages = [{"role": "user", "content": data.question}]
    request = CacheRequest(
        model=_model(runtime, data.model),
        messages=messages,
        tenant=data.tenant,
        temperature=data.temperature,
    )
    result = await cache.lookup(request, dry_run=True, threshold=data.threshold)
    hit = result.hit
    return LookupView(
        would_hit=hit is not None,
        status=result.status,
        threshold=result.threshold,
        reason=result.reason,
        hit=None if hit is None else HitView.of_hit(hit.entry, hit.similarity),
        candidates=[
            CandidateView(
                id=c.candidate.entry.id,
                question=c.candidate.entry.prompt,
                similarity=round(c.candidate.similarity, 6),
                tier=c.candidate.tier,
                above_threshold=c.above_threshold,
                guard=None
                if c.verdict is None
                else GuardView(c.verdict.ok, c.verdict.rule, c.verdict.detail),
            )
            for c in result.candidates
        ],
    )


def _options(*handlers: HTTPRouteHandler) -> HTTPRouteHandler:
    """OPTIONS for a path that several handlers serve, listing all their methods. Put
    before them: Litestar makes one of its own as a path's first handler is registered,
    and that one lists only the first handler's method, however many follow."""
    allow = ", ".join(sorted({"OPTIONS"}.union(*(h.http_methods for h in handlers))))
    (path,) = handlers[0].paths

    @route(path, http_method="OPTIONS", status_code=204, include_in_schema=False)
    async def options() -> Response[None]:
        return Response(None, status_code=204, headers={"Allow": allow})

    return options


admin_router = Router(
    path="/admin",
    guards=[admin_guard],
    tags=["admin"],
    security=[{"AdminKey": []}],
    exception_handlers={RedisError: _redis_failed, RedisVLError: _redis_failed},
    route_handlers=[
        _options(get_threshold, put_threshold),
        get_threshold,
        put_threshold,
        stats,
        _options(list_entries, seed_entry),
        list_entries,
        seed_entry,
        _options(get_entry, delete_entry),
        get_entry,
        delete_entry,
        flush,
        lookup,
        engine_stats,
        upstreams,
    ],
)
