"""The balancer: which of an upstream's servers answers a request (gateway/upstream/http.py
asks it for each choice among the healthy servers of the request's model; which upstream
serves a model is the model router's choice, gateway/upstream/model_router.py):

- `round_robin`: turns, in proportion to the servers' weights;
- `least_load`: the lowest load per unit of weight;
- `prefix` (SGLang's cache-aware rule): the server that was sent the longest matching
  start of the prompt, unless its load exceeds the least-loaded one's by more than the
  balance threshold, when the least-loaded one gets it. A prompt whose start nobody was
  sent goes to the server whose prefix table is smallest (the most room in its cache),
  the threshold permitting.

Under any policy, a session (the X-Session-Id header, else the request's `user`) stays
on the server it was sent to while that one is healthy. Load is this gateway's requests
in flight on a server, live, plus the running and waiting requests its /metrics showed
at the last health check beyond ours (another gateway's). Each choice is counted by
reason: `prefix`, `load`, `session`, or `fallback` (nothing to go by: a round-robin
turn, a prompt start nobody was sent, a retry after a server failed)."""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.upstream.prefix_table import BLOCK_BYTES, BYTES_PER_TOKEN, PrefixTable, prompt_blocks

POLICIES = ("round_robin", "least_load", "prefix")
REASONS = ("prefix", "load", "session", "fallback")
SESSION_HEADER = "X-Session-Id"
PREFIX_TTL = 1800.0  # seconds a prompt start is remembered unsent
SESSION_TTL = 3600.0  # seconds a quiet session keeps its server
MAX_SESSIONS = 100_000  # the least recently seen go first


@dataclass(frozen=True)
class BalancerConfig:
    policy: str = "prefix"
    balance_threshold: float = 2.0  # in requests per unit of weight
    session_affinity: bool = True
    # About how many prompt tokens each server's prefix cache holds: what the gateway
    # remembers per server.
    prefix_capacity: int = 500_000

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        if not self.balance_threshold >= 0:
            raise ValueError(f"balance_threshold must be >= 0, not {self.balance_threshold}")
        if self.prefix_capacity < 1:
            raise ValueError(f"prefix_capacity must be >= 1 token, not {self.prefix_capacity}")


@dataclass
class Backend:
    """One server as the balancer sees it."""

    name: str
    weight: float = 1.0
    in_flight: int = 0  # this gateway's requests on it now
    others: int = 0  # its running and waiting requests beyond ours, at the last check
    chosen: Counter[str] = field(default_factory=Counter)  # choices by reason
    turn: float = 0.0  # its credit in weighted round robin
    last: int = 0  # when it was last chosen (a sequence number): ties go to the least recent

    @property
    def load(self) -> float:
        return (self.in_flight + self.others) / self.weight

    def observe(self, running: int | None, waiting: int | None) -> None:
        """Its engine's own counts, read at a health check. Those include our requests
        that were in flight then, which are counted live instead: only the rest are
        other clients'. Unknown counts (no /metrics) leave ours alone."""
        total = (running or 0) + (waiting or 0)
        self.others = max(0, total - self.in_flight)


@dataclass(frozen=True)
class BalancerKey:
    blocks: tuple[int, ...] = ()  # the prompt start's chained block hashes (prefix only)
    session: str | None = None


def prompt_text(messages: Iterable[Mapping[str, object]]) -> str:
    """Chat messages as one text, in order: what the prompt starts with whatever the
    server's chat template (content parts as their JSON)."""
    parts = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        parts.append(f"<|{message.get('role')}|>\n{text}\n")
    return "".join(parts)


class Balancer:
    def __init__(self, config: BalancerConfig) -> None:
        self.config = config
        blocks = max(1, config.prefix_capacity * BYTES_PER_TOKEN // BLOCK_BYTES)
        self.prefixes = PrefixTable(blocks, PREFIX_TTL)
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._sequence = itertools.count(1)

    def key(
        self, model: str, prompt: str | None, salt: str | None, session: str | None
    ) -> BalancerKey:
        """What a request is balanced by: its prompt start (hashed under its model and
        prefix-cache salt, as the engine keys its blocks) and its session."""
        blocks: tuple[int, ...] = ()
        if self.config.policy == "prefix" and prompt:
            blocks = prompt_blocks(f"{model}\0{salt or ''}", prompt)
        return BalancerKey(blocks, session if self.config.session_affinity else None)

    def choose(self, candidates: list[Backend], key: BalancerKey, retry: bool = False) -> Backend:
        """One of `candidates` (healthy, untried; at least one) for a request with `key`;
        `retry` after another server failed it. Counts the choice and remembers it."""
        backend, reason = self._bound(candidates, key.session) or self._by_policy(candidates, key)
        backend.chosen["fallback" if retry else reason] += 1
        backend.last = next(self._sequence)
        if key.session is not None:
            self._sessions[key.session] = (backend.name, time.monotonic())
            self._sessions.move_to_end(key.session)
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        if key.blocks:
            self.prefixes.record(backend.name, key.blocks)
        return backend

    def forget(self, name: str) -> None:
        """`name` went down: its cache is lost, its sessions move."""
        self.prefixes.forget(name)
        for session in [s for s, (bound, _) in self._sessions.items() if bound == name]:
            del self._sessions[session]

    def _bound(self, candidates: list[Backend], session: str | None) -> tuple[Backend, str] | None:
        entry = self._sessions.get(session) if session is not None else None
        if entry is None or time.monotonic() - entry[1] > SESSION_TTL:
            return None
        return next(((b, "session") for b in candidates if b.name == entry[0]), None)

    def _by_policy(self, candidates: list[Backend], key: BalancerKey) -> tuple[Backend, str]:
        if self.config.policy == "round_robin":
            return _turn(candidates), "fallback"
        least = min(candidates, key=_by_load)
        if self.config.policy == "least_load" or not key.blocks:
            return least, "load"
        matched = self.prefixes.matches(key.blocks, {b.name for b in candidates})
        if matched:
            longest = max(matched.values())
            best = min((b for b in candidates if matched.get(b.name) == longest), key=_by_load)
            reason = "prefix"
        else:
            best = min(candidates, key=lambda b: (self.prefixes.size(b.name), *_by_load(b)))
            reason = "fallback"
        if best.load - least.load > self.config.balance_threshold:
            return least, "load"
        return best, reason


def _by_load(backend: Backend) -> tuple[float, int]:
    return backend.load, backend.last


def _turn(candidates: list[Backend]) -> Backend:
    """Smooth weighted round robin (nginx's): each turn every candidate earns its weight
    and the richest is chosen and pays the total, so equal weights take plain turns."""
    for backend in candidates:
        backend.turn += backend.weight
    chosen = max(candidates, key=lambda b: b.turn)
    chosen.turn -= sum(b.weight for b in candidates)
    return chosen
