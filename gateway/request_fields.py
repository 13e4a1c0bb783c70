"""The constrained types of request fields, each declared once. msgspec checks them as a
body is decoded (gateway/strict_json.py: a value out of range is a 400 naming the field)
and writes the OpenAPI document's schema from the same declaration
(gateway/openapi_docs.py), so the two cannot disagree. Sampling bounds are the engine's
own (engine/sampling_params.py), the cache's are the cache's (TTL, similarity)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, TypedDict

from msgspec import Meta

from cache.store import MAX_TTL
from engine.sampling_params import MAX_TOKENS, SEED, TEMPERATURE, TOP_K, TOP_P, Bounds


def _meta(bounds: Bounds, **more: Any) -> Meta:
    return Meta(**{k: v for k, v in asdict(bounds).items() if v is not None}, **more)


Temperature = Annotated[float, _meta(TEMPERATURE)]
TopP = Annotated[float, _meta(TOP_P)]
MaxTokens = Annotated[int, _meta(MAX_TOKENS)]
Seed = Annotated[int, _meta(SEED)]
TopK = Annotated[int, _meta(TOP_K)]  # vLLM's: -1 and 0 are off
MinP = Annotated[float, Meta(ge=0, le=1)]
RepetitionPenalty = Annotated[float, Meta(gt=0)]
Similarity = Annotated[float, Meta(ge=0, le=1)]  # a cache threshold (cache/thresholds.py)
Ttl = Annotated[int, Meta(ge=1, le=MAX_TTL, description="seconds, at most ten years")]
NonEmpty = Annotated[str, Meta(min_length=1)]
NonBlank = Annotated[str, Meta(pattern=r"\S")]  # has a character other than whitespace
# A tenant or model as the cache files it: no control characters (a NUL would end the
# query RediSearch parses), and not empty (no filter could name it). Query parameters
# state the pattern with TAG_PATTERN; there an empty value is no filter.
TAG_PATTERN = r"^[^\x00-\x1f\x7f]*$"
Tag = Annotated[str, Meta(pattern=TAG_PATTERN, min_length=1)]
TokenId = Annotated[int, Meta(ge=0)]  # below each model's vocabulary size, too
TokenIds = Annotated[list[TokenId], Meta(min_length=1)]

MAX_STOP = 4  # OpenAI's
Stop = NonEmpty | Annotated[list[NonEmpty], Meta(max_length=MAX_STOP)]


class GivenSampling(TypedDict, total=False):
    """What sampling_given found: only the fields the request gives."""

    temperature: float
    top_p: float


def sampling_given(request: Any) -> GivenSampling:
    """The request's temperature and top_p where it gives them: a job left without one
    has the engine's default (CompletionJob's, SamplingParams')."""
    given = GivenSampling()
    if request.temperature is not None:
        given["temperature"] = request.temperature
    if request.top_p is not None:
        given["top_p"] = request.top_p
    return given
