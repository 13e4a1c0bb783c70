"""semgate's semantic cache over Redis: tiers (exact, semantic English, semantic
multilingual), near-miss guards with a fitted verifier, the policy that decides what may
be cached, and coalescing of concurrent misses. No web code, no model code (calibration
and fitting are offline tools: bench/)."""

from cache.coalescer import Coalescer, Seat
from cache.embedder import Embedder
from cache.entry import CacheEntry, Candidate
from cache.guard import Guard, LanguageGuard, Verdict
from cache.lookup_result import LookupResult
from cache.multilingual_embedder import MultilingualEmbedder
from cache.policy import Bypass, CachePolicy, CacheRequest, CacheScope, CompletionOutcome
from cache.redis_server import EmbeddedRedis, RedisUnavailableError
from cache.restart_backoff import RestartBackoff
from cache.runtime import CacheRuntime
from cache.semantic_cache import SemanticCache
from cache.shared_flights import FlightError, FlightLost, SharedFlights
from cache.stats import CacheStats
from cache.store import CacheStore
from cache.thresholds import DEFAULT_THRESHOLD, Thresholds

__all__ = [
    "DEFAULT_THRESHOLD",
    "Bypass",
    "CacheEntry",
    "CachePolicy",
    "CacheRequest",
    "CacheRuntime",
    "CacheScope",
    "CacheStats",
    "CacheStore",
    "Candidate",
    "Coalescer",
    "CompletionOutcome",
    "EmbeddedRedis",
    "Embedder",
    "FlightError",
    "FlightLost",
    "Guard",
    "LanguageGuard",
    "LookupResult",
    "MultilingualEmbedder",
    "RedisUnavailableError",
    "RestartBackoff",
    "Seat",
    "SemanticCache",
    "SharedFlights",
    "Thresholds",
    "Verdict",
]
