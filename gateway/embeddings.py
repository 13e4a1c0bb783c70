"""POST /v1/embeddings in OpenAI's shape, served by the bundled embedder: the cache's own
(one model in memory, its micro-batcher shared with cache lookups), loaded on first use
when the cache is off."""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Literal

import msgspec
import numpy as np
from msgspec import Meta

from cache import Embedder
from gateway.errors import CONTEXT_LENGTH_EXCEEDED, UNSUPPORTED, APIError
from gateway.request_fields import NonEmpty, TokenId, TokenIds

MAX_INPUTS = 2048  # OpenAI's limit on inputs a request
BUNDLED_NAME = "all-minilm-l6-v2"


class EmbeddingRequest(msgspec.Struct):
    # Text, texts, or token ids (one list, or one per input): msgspec takes one array type
    # a union, so the items' types are the union. Token ids: upstreams' models only.
    input: (
        NonEmpty
        | Annotated[list[NonEmpty | TokenId | TokenIds], Meta(min_length=1, max_length=MAX_INPUTS)]
    )
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


class Embedding(msgspec.Struct):
    embedding: list[float] | str  # base64: the float32 vector's little-endian bytes
    index: int
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"


def _texts(value: str | list[str | int | list[int]]) -> list[str]:
    """The texts (not empty, at most MAX_INPUTS: EmbeddingRequest's types say so)."""
    given = [value] if isinstance(value, str) else value
    texts = [t for t in given if isinstance(t, str)]
    if len(texts) != len(given):
        # Token ids are a tokenizer's own: an SDK's (tiktoken's) ids mean nothing to this
        # model. LangChain's OpenAIEmbeddings sends them unless told not to.
        raise APIError(400, "input as token ids is not supported: send text (with LangChain's "
                       "OpenAIEmbeddings, set check_embedding_ctx_length=False)",
                       param="input", code=UNSUPPORTED)  # fmt: skip
    return texts


class EmbeddingService:
    """The one bundled embedder, shared with the cache (gateway/runtime.py hands it over)."""

    def __init__(self) -> None:
        self._embedder: Embedder | None = None
        self._lock = asyncio.Lock()

    async def embedder(self) -> Embedder:
        """Loads it on first use (a few seconds; from disk after the first run)."""
        async with self._lock:
            if self._embedder is None:
                self._embedder = await asyncio.to_thread(Embedder)
            return self._embedder

    def serves(self, model: str) -> bool:
        """Its names, any case, with or without the hub's owner: the bundled model's, and
        the id its answers carry (which names its weights' form, e.g. `-int8`)."""
        name = model.rsplit("/", 1)[-1].lower()
        loaded = self._embedder.model_id if self._embedder is not None else None
        return name in (BUNDLED_NAME, loaded)

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()

    async def create(self, request: EmbeddingRequest) -> EmbeddingList:
        texts = _texts(request.input)
        if not self.serves(request.model):
            raise APIError(404, f"The model {request.model!r} does not exist",
                           param="model", code="model_not_found")  # fmt: skip
        embedder = await self.embedder()
        if request.dimensions is not None and request.dimensions != embedder.dims:
            raise APIError(400, f"{embedder.model_id} makes {embedder.dims}-dimensional vectors; "
                           "it cannot shorten them", param="dimensions",
                           code=UNSUPPORTED)  # fmt: skip
        counts = await asyncio.to_thread(lambda: [embedder.num_tokens(t) for t in texts])
        for i, count in enumerate(counts):
            if count > embedder.max_tokens:
                raise APIError(400, f"input[{i}] is {count} tokens, over the model's window of "
                               f"{embedder.max_tokens}", param="input",
                               code=CONTEXT_LENGTH_EXCEEDED)  # fmt: skip
        vectors = await asyncio.gather(*(embedder.embed(t) for t in texts))
        data = [Embedding(_encoded(v, request.encoding_format), i) for i, v in enumerate(vectors)]
        total = sum(counts)
        return EmbeddingList(data, embedder.model_id, EmbeddingUsage(total, total))


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
