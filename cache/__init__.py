"""semgate's semantic cache over Redis: tiers (exact, semantic English, semantic
multilingual), near-miss guards with a fitted verifier, and single-flight. No web code,
no model code (calibration and fitting are offline tools: bench/)."""

from cache.embedder import Embedder
from cache.guard import Guard, LanguageGuard, Verdict
from cache.multilingual_embedder import MultilingualEmbedder
from cache.policy import CachePolicy, CacheRequest, CacheScope, CompletionOutcome
from cache.redis_server import EmbeddedRedis, RedisUnavailableError
from cache.restart_backoff import RestartBackoff
from cache.semantic_cache import CacheRuntime, LookupResult, SemanticCache
from cache.shared_flight import FlightError, FlightLost, SharedFlights
from cache.stats import CacheStats
from cache.store import CacheEntry, CacheStore, Candidate
from cache.thresholds import DEFAULT_THRESHOLD, Thresholds

__all__ = [
    "DEFAULT_THRESHOLD",
    "CacheEntry",
    "CachePolicy",
    "CacheRequest",
    "CacheRuntime",
    "CacheScope",
    "CacheStats",
    "CacheStore",
    "Candidate",
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
    "SemanticCache",
    "SharedFlights",
    "Thresholds",
    "Verdict",
]
