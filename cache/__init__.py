"""semgate's semantic cache over Redis: exact and semantic tiers, a near-miss guard,
and single-flight. No web code, no model code (calibration is an offline tool: bench/)."""

from cache.embedder import Embedder
from cache.guard import Guard, Verdict
from cache.policy import CachePolicy, CacheRequest, CacheScope, CompletionOutcome
from cache.redis_server import EmbeddedRedis, RedisUnavailableError
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
    "LookupResult",
    "RedisUnavailableError",
    "SemanticCache",
    "SharedFlights",
    "Thresholds",
    "Verdict",
]
