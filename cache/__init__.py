"""semgate's semantic cache over Redis: exact and semantic tiers, a near-miss guard,
single-flight and calibration. No web code, no model code."""

from cache.calibrate import CalibrationReport, Pair, calibrate, load_pairs
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
    "CalibrationReport",
    "Candidate",
    "CompletionOutcome",
    "EmbeddedRedis",
    "Embedder",
    "FlightError",
    "FlightLost",
    "Guard",
    "LookupResult",
    "Pair",
    "RedisUnavailableError",
    "SemanticCache",
    "SharedFlights",
    "Thresholds",
    "Verdict",
    "calibrate",
    "load_pairs",
]
