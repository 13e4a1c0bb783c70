"""What the cache and the engine's KV store share to survive a Redis that stops answering
or fails over: the circuit breaker, and the one place Redis URLs (Sentinel's included)
become clients (a ground-floor package, so that neither imports the other)."""

from resilience.circuit_breaker import CircuitBreaker

__all__ = ["CircuitBreaker"]
