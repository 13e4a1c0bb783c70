"""Gateway settings: defaults, then a TOML config file, then SEMGATE_* environment
variables, then command-line flags (each overrides the one before).

The in-process engine's settings are one section, `Settings.engine`
(gateway/engine_settings.py; the config file's `[engine]` table); flags, SEMGATE_*
variables and the config file's top level name them flat, as they name the others
(`--max-num-seqs`, SEMGATE_MAX_NUM_SEQS, `max_num_seqs`).

API keys map to tenants: `[keys]` in the config file (`"sk-..." = "tenant"`) or
SEMGATE_API_KEYS="sk-a:tenant-a,sk-b:tenant-b". No keys: chat is open and every
request is tenant "default". Upstreams and model aliases are spelled as
gateway/upstream/specs.py says, the settings of each upstream group as
gateway/upstream/group_settings.py says.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin, get_type_hints

from cache import DEFAULT_THRESHOLD, Thresholds
from cache.store import check_ttl
from gateway.engine_settings import EngineSettings
from gateway.upstream.group_settings import (
    GROUP_SETTINGS,
    GroupSettings,
    from_config,
    group_settings,
    merged,
    parse_group_settings,
)
from gateway.upstream.specs import (
    as_prefill,
    check_upstreams,
    parse_aliases,
    parse_upstreams,
    upstreams_from_toml,
)
from resilience.redis_url import check_redis_url

if TYPE_CHECKING:
    from litestar.middleware.rate_limit import DurationUnit

RATE_UNITS: tuple[DurationUnit, ...] = ("second", "minute", "hour", "day")


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "semgate" / "redis"


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    engine: EngineSettings = field(default_factory=EngineSettings)
    # Remote OpenAI-compatible servers that answer misses instead of the engine: those
    # whose models are discovered, and groups serving one model each (model -> URLs).
    upstreams: list[str] = field(default_factory=list)
    upstream_groups: dict[str, list[str]] = field(default_factory=dict)
    local_engine: bool = False  # run the in-process engine beside the upstreams too
    model_aliases: dict[str, str] = field(default_factory=dict)  # public name -> served
    # Every upstream group's settings unless it has its own (upstream_settings: model ->
    # name -> value; gateway/upstream/group_settings.py): how its servers share its requests
    # (gateway/upstream/balancer.py), how long a request may take, the key sent to them.
    upstream_policy: str = "prefix"
    upstream_balance_threshold: float = 2.0
    upstream_session_affinity: bool = True
    upstream_prefix_capacity: int = 500_000
    upstream_timeout: float = 600.0
    upstream_api_key: str | None = field(default=None, repr=False)  # sent to the upstreams
    upstream_settings: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    upstream_header: bool = False  # X-Upstream names the server that answered
    # Prefill servers (vLLM's P/D protocol, gateway/upstream/disaggregation.py): plain URLs
    # prefill for the servers whose models are discovered, a group's (model -> URLs) for
    # that model's group, whose servers then decode.
    upstream_prefill: list[str] = field(default_factory=list)
    upstream_prefill_groups: dict[str, list[str]] = field(default_factory=dict)
    # A prompt goes to a prefill server only when its tokens not cached on the decode
    # servers (as the gateway estimates them) exceed pd_min_prompt_tokens, and the prefill
    # servers' queue is under pd_max_prefill_queue requests per healthy server. 1024: where
    # a remote prefill's cost to its own request (the hop, the save, the load) falls to
    # about a tenth of a local prefill (`semgate bench pd-threshold`, docs/deploy.md).
    pd_min_prompt_tokens: int = 1024
    pd_max_prefill_queue: int = 2
    # Seconds a prefill may take (at most the group's timeout) before the decode server
    # prefills the prompt itself.
    pd_prefill_timeout: float = 60.0
    # Seconds without remote prefills after one failed or came back without
    # kv_transfer_params (a prefill server whose KV store is down computes each prompt only
    # for the decode server to compute it again); 0: every request tries.
    pd_failure_backoff: float = 10.0
    # Cache.
    cache: bool = True
    redis_url: str | None = None
    redis_data_dir: Path = field(default_factory=default_data_dir)
    redis_maxmemory: str = "512mb"
    threshold: float = DEFAULT_THRESHOLD
    model_thresholds: dict[str, float] = field(default_factory=dict)
    tenant_thresholds: dict[str, float] = field(default_factory=dict)
    cache_ttl: int = 7 * 24 * 3600
    cache_max_temperature: float = 1.0
    # Start the upstream while the cache is asked (aborted on a hit): a miss does not
    # wait for the lookup.
    early_start: bool = True
    # Security and limits.
    api_keys: dict[str, str] = field(default_factory=dict, repr=False)  # key -> tenant
    admin_key: str | None = field(default=None, repr=False)
    rate_limit: str | None = None  # "120/minute" per API key
    admin_rate_limit: str | None = None  # the admin key's own budget ("600/minute")
    # Per client address, for requests with a missing or unknown key: enough for a client
    # with a mistyped key to see its 401s, few enough to slow guessing. Behind a proxy
    # every client has its address.
    failed_auth_rate_limit: str | None = "60/minute"
    max_body_bytes: int = 4 * 1024 * 1024
    # What a client may send beyond the body (gateway/client_limits.py): the request line
    # and headers together, their count, the seconds to send them and then the body, the
    # seconds an idle keep-alive connection stays open, and the open connections.
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 1000
    # The most tokens an answer whose request sets no max_tokens gets (0: up to the
    # context, as vLLM): a small model can loop to its context's end (docs/gateway.md).
    default_max_tokens: int = 1024
    # At SIGTERM, how long requests in flight may take to finish (gateway/drain.py).
    shutdown_grace: float = 30.0
    # Lookups in a row that time out on Redis before the cache is skipped, and for how
    # long at first (resilience/circuit_breaker.py).
    cache_breaker_after: int = 3
    cache_breaker_backoff: float = 5.0
    log_format: str = "text"  # "text" | "json"

    def __post_init__(self) -> None:
        # Fails here, at start, rather than in the cache's start-up retries.
        Thresholds(self.threshold, dict(self.model_thresholds), dict(self.tenant_thresholds))
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, not {self.log_format!r}")
        parse_rate(self.rate_limit)  # validate early
        parse_rate(self.admin_rate_limit)
        parse_rate(self.failed_auth_rate_limit)
        for name in ("max_body_bytes", "port", "max_header_bytes", "max_headers",
                     "max_connections", "cache_breaker_after"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout",
                     "cache_breaker_backoff"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.shutdown_grace < 0:
            raise ValueError("shutdown_grace must be >= 0")
        if self.default_max_tokens < 0:
            raise ValueError("default_max_tokens must be >= 0 (0: up to the context)")
        check_ttl(self.cache_ttl, "cache_ttl")
        if self.redis_url:  # empty: the embedded Redis, as unset
            check_redis_url(self.redis_url, "redis_url")
        if any(not key or not tenant for key, tenant in self.api_keys.items()):
            raise ValueError("API keys and tenant names must be non-empty")
        self.upstreams, self.upstream_groups = check_upstreams(
            self.upstreams, self.upstream_groups, self.model_aliases
        )
        self._check_prefill()
        for model in self.upstream_settings:
            if model not in self.upstream_groups:
                raise ValueError(f"upstream settings for {model!r}, which no upstream group serves")
        for group in [None, *self.upstream_groups]:
            self.group(group)  # checked now, at start

    def _check_prefill(self) -> None:
        """Prefill servers need decode servers: their model's group, or for plain URLs the
        servers whose models are discovered."""
        self.upstream_prefill, self.upstream_prefill_groups = check_upstreams(
            self.upstream_prefill, self.upstream_prefill_groups, {}
        )
        for model in self.upstream_prefill_groups:
            if model not in self.upstream_groups:
                raise ValueError(
                    f"prefill servers for {model!r}, which no upstream group decodes "
                    f"(give its decode servers: --upstream {model}=URL)"
                )
        if self.upstream_prefill and not self.upstreams:
            raise ValueError(
                "prefill servers whose models are discovered need decode servers whose models "
                "are discovered (--upstream URL)"
            )
        if self.pd_min_prompt_tokens < 0:
            raise ValueError("pd_min_prompt_tokens must be >= 0")
        if self.pd_max_prefill_queue < 1:
            raise ValueError("pd_max_prefill_queue must be >= 1")
        if not self.pd_prefill_timeout > 0:
            raise ValueError("pd_prefill_timeout must be > 0")
        if not self.pd_failure_backoff >= 0:
            raise ValueError("pd_failure_backoff must be >= 0")

    def group(self, model: str | None) -> GroupSettings:
        """The settings of `model`'s upstream group (None: the servers whose models are
        discovered): its own, else the gateway-wide ones."""
        # Every setting but the weights (one per URL: a group's own) has a gateway-wide one.
        values = {n: getattr(self, f"upstream_{n}") for n in GROUP_SETTINGS if n != "weights"}
        if model is None:
            return group_settings(values, None, "upstreams")
        values.update(self.upstream_settings.get(model, {}))
        return group_settings(values, len(self.upstream_groups[model]), f"upstream group {model}")

    @property
    def runs_engine(self) -> bool:
        """Whether the in-process engine runs: without upstreams, or asked to beside them."""
        return self.local_engine or not (self.upstreams or self.upstream_groups)

    @property
    def redis_max_connections(self) -> int:
        """Redis connections this process opens at most: one for each request the engine
        admits (a store, or a replica's shared flight followed, holds one a while) and as
        many again as run at once for lookups. Past it a request waits for a connection,
        within its lookup's budget."""
        return 2 * self.engine.max_num_seqs + self.engine.max_waiting

    @classmethod
    def load(
        cls,
        config_file: Path | None = None,
        env: dict[str, str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Defaults < config file < environment < overrides (None overrides are ignored),
        every setting by its flat name (FLAT_SETTINGS), the engine's too."""
        values: dict[str, Any] = {}
        layers = [
            _read_config_file(config_file) if config_file is not None else {},
            _from_env(os.environ if env is None else env),
            {k: v for k, v in overrides.items() if v is not None},
        ]
        for layer in layers:
            values.update(layer)
        # Each group's settings merge value by value (a flag changes one, not all).
        if group_values := merged(layer.get("upstream_settings") for layer in layers):
            values["upstream_settings"] = group_values
        unknown = sorted(set(values) - set(FLAT_SETTINGS))
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        if "redis_data_dir" in values:
            values["redis_data_dir"] = Path(values["redis_data_dir"]).expanduser()
        engine = {name: values.pop(name) for name in ENGINE_SETTINGS if name in values}
        return cls(engine=EngineSettings(**engine), **values)


ENGINE_SETTINGS = frozenset(f.name for f in fields(EngineSettings))
# Each setting's type by the flat name that flags, SEMGATE_* and the config file's top
# level give it: the engine's beside the others.
FLAT_SETTINGS: dict[str, Any] = {
    name: hint
    for cls in (Settings, EngineSettings)
    for name, hint in get_type_hints(cls).items()
    if name != "engine"
}


def parse_rate(text: str | None) -> tuple[DurationUnit, int] | None:
    """ "120/minute" -> ("minute", 120); None (or empty) for no limit."""
    if not text:
        return None
    count, _, unit = text.partition("/")
    if unit not in RATE_UNITS or not count.strip().isdigit() or int(count) < 1:
        raise ValueError(
            f"rate limit must look like 120/minute (units: {', '.join(RATE_UNITS)}), got {text!r}"
        )
    return unit, int(count)


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read config file {path}: {exc}") from exc
    if "keys" in data:
        data["api_keys"] = data.pop("keys")
    # Groups' own settings: in their [upstreams.MODEL] tables, or [upstream_settings.MODEL].
    tables = data.pop("upstream_settings", {})
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise ValueError(
            f"config file {path}: upstream_settings must hold [upstream_settings.MODEL] tables"
        )
    what = f"config file {path}: upstream_settings"
    own = {model: from_config(model, table, what) for model, table in tables.items()}
    if "upstreams" in data:
        data.update(upstreams_from_toml(data.pop("upstreams"), f"config file {path}: upstreams"))
    if "upstream_prefill" in data:
        what = f"config file {path}: upstream_prefill"
        data.update(as_prefill(upstreams_from_toml(data.pop("upstream_prefill"), what), what))
    if own:
        data["upstream_settings"] = merged([data.get("upstream_settings"), own])
    # The engine's settings in an [engine] table, or flat at the top level (as before
    # the table), but not both ways at once.
    engine = data.pop("engine", {})
    if not isinstance(engine, dict):
        raise ValueError(f"config file {path}: `engine` must be a table ([engine])")
    if unknown := sorted(set(engine) - ENGINE_SETTINGS):
        raise ValueError(f"config file {path}: unknown [engine] setting(s): {', '.join(unknown)}")
    if twice := sorted(set(engine) & set(data)):
        raise ValueError(
            f"config file {path}: {', '.join(twice)} set both in [engine] and at the top level"
        )
    return {**data, **engine}


def parse_pairs(text: str, what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.rpartition(":")
        if not sep or not key or not value:
            raise ValueError(f"{what} must look like a:b,c:d, got {item!r}")
        pairs[key] = value
    return pairs


def env_variable(name: str) -> str:
    """The environment variable of the setting `name` (its flat name)."""
    return f"SEMGATE_{name.upper()}"


def _env_value(name: str, kind: Any, raw: str) -> Any:
    """SEMGATE_<NAME>'s text as the setting's type (bool, str, int, float or Path)."""
    if kind is bool:
        return raw.lower() not in ("0", "false", "no", "off")
    try:
        return kind(raw)
    except ValueError as exc:
        raise ValueError(f"{env_variable(name)}={raw!r}: {exc}") from exc


def _from_env(env: Any) -> dict[str, Any]:
    """SEMGATE_<NAME> for every plain setting, typed as the field is; lists and maps
    have their own spellings (upstream specs, key:tenant pairs, PUBLIC=MODEL aliases)."""
    out: dict[str, Any] = {}
    if env.get("REDIS_URL"):
        out["redis_url"] = env["REDIS_URL"]
    for name, hint in FLAT_SETTINGS.items():
        if get_origin(hint) in (list, dict):
            continue  # spelled below
        kinds = [k for k in get_args(hint) or (hint,) if k is not type(None)]
        raw = env.get(env_variable(name))
        if raw and len(kinds) == 1 and kinds[0] in (bool, str, int, float, Path):
            out[name] = _env_value(name, kinds[0], raw)
    # Set but empty (compose passes it so when it is unset): no admin API, where unset
    # means a key generated for the run.
    if env.get(env_variable("admin_key")) == "":
        out["admin_key"] = ""
    if env.get("SEMGATE_UPSTREAMS"):
        out.update(parse_upstreams([env["SEMGATE_UPSTREAMS"]], "SEMGATE_UPSTREAMS"))
    if env.get("SEMGATE_UPSTREAM_PREFILL"):
        what = "SEMGATE_UPSTREAM_PREFILL"
        out.update(as_prefill(parse_upstreams([env[what]], what), what))
    if env.get("SEMGATE_UPSTREAM_SETTINGS"):
        out["upstream_settings"] = parse_group_settings(
            [env["SEMGATE_UPSTREAM_SETTINGS"]], "SEMGATE_UPSTREAM_SETTINGS"
        )
    if env.get("SEMGATE_MODEL_ALIASES"):
        out["model_aliases"] = parse_aliases(
            [env["SEMGATE_MODEL_ALIASES"]], "SEMGATE_MODEL_ALIASES"
        )
    if env.get("SEMGATE_API_KEYS"):
        out["api_keys"] = parse_pairs(env["SEMGATE_API_KEYS"], "SEMGATE_API_KEYS")
    return out
