"""Settings per upstream group: how its balancer shares its requests among its servers
(`policy`, `balance_threshold`, `session_affinity`, `prefix_capacity`:
gateway/upstream/balancer.py), its `timeout` and `api_key`, and its servers' `weights`
(one per URL, in order).

Each defaults to the gateway-wide setting `upstream_<name>` (the servers whose models are
discovered take those alone). A group's own values come from its table in the config
file (`[upstreams.MODEL]`, beside `urls`), SEMGATE_UPSTREAM_SETTINGS and
`--upstream-setting MODEL:NAME=VALUE` (repeatable; the variable holds such specs separated
by `;`), merged value by value in that order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.upstream.balancer import BalancerConfig

SEPARATOR = ";"
# Each setting's type: what a flag's text is read as, and what a config file must give.
GROUP_SETTINGS: dict[str, type] = {
    "policy": str,
    "balance_threshold": float,
    "session_affinity": bool,
    "prefix_capacity": int,
    "timeout": float,
    "api_key": str,
    "weights": list,
}
BALANCER_SETTINGS = ("policy", "balance_threshold", "session_affinity", "prefix_capacity")


@dataclass(frozen=True)
class GroupSettings:
    balancer: BalancerConfig
    timeout: float = 600.0
    api_key: str | None = field(default=None, repr=False)
    weights: list[float] | None = None  # one per URL; None: equal


def group_settings(values: Mapping[str, Any], urls: int | None, what: str) -> GroupSettings:
    """Checked settings from `values` (every name but `weights` given), for a group of
    `urls` servers (None: discovered ones, which take no weights)."""
    weights = values.get("weights")
    if weights is not None and len(weights) != urls:
        where = "servers whose models are discovered" if urls is None else f"{urls} URL(s)"
        raise ValueError(f"{what}: {len(weights)} weight(s) for {where}")
    if weights is not None and not all(w > 0 for w in weights):
        raise ValueError(f"{what}: weights must be > 0, got {weights}")
    if not values["timeout"] > 0:
        raise ValueError(f"{what}: timeout must be > 0 seconds, got {values['timeout']}")
    try:
        balancer = BalancerConfig(**{name: values[name] for name in BALANCER_SETTINGS})
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from exc
    return GroupSettings(balancer, values["timeout"], values["api_key"], weights)


def parse_group_settings(specs: Iterable[str], what: str) -> dict[str, dict[str, Any]]:
    """`MODEL:NAME=VALUE` specs (each may hold several, `;`-separated) -> model -> name ->
    value, typed (weights: numbers separated by commas)."""
    out: dict[str, dict[str, Any]] = {}
    for spec in (s.strip() for text in specs for s in text.split(SEPARATOR)):
        if not spec:
            continue
        target, sep, text = spec.partition("=")
        model, colon, name = target.rpartition(":")  # model names may hold colons
        if not sep or not colon or not model.strip():
            raise ValueError(f"{what} must look like MODEL:NAME=VALUE, got {spec!r}")
        name = name.strip()
        out.setdefault(model.strip(), {})[name] = _from_text(name, text.strip(), what)
    return out


def _known(name: str, what: str) -> type:
    kind = GROUP_SETTINGS.get(name)
    if kind is None:
        known = ", ".join(GROUP_SETTINGS)
        raise ValueError(f"{what}: unknown upstream group setting {name!r} (known: {known})")
    return kind


def _from_text(name: str, text: str, what: str) -> Any:
    kind = _known(name, what)
    try:
        if kind is bool:
            return text.lower() not in ("0", "false", "no", "off")
        if kind is list:
            return [float(w) for w in text.split(",")]
        return kind(text)
    except ValueError as exc:
        raise ValueError(f"{what}: {name}={text!r}: {exc}") from exc


def from_config(model: str, table: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A group's settings from its config-file table (its `urls` left out)."""
    out = {}
    for name, value in table.items():
        if name == "urls":
            continue
        kind = _known(name, what)
        numbers = isinstance(value, list) and all(
            isinstance(w, int | float) and not isinstance(w, bool) for w in value
        )
        fits = {
            bool: isinstance(value, bool),
            int: isinstance(value, int) and not isinstance(value, bool),
            float: isinstance(value, int | float) and not isinstance(value, bool),
            str: isinstance(value, str),
            list: numbers,
        }[kind]
        if not fits:
            raise ValueError(f"{what}: {model}.{name} must be a {kind.__name__}, got {value!r}")
        out[name] = [float(w) for w in value] if kind is list else value
    return out


def merged(layers: Iterable[Mapping[str, Mapping[str, Any]] | None]) -> dict[str, dict[str, Any]]:
    """Groups' settings from several sources, later ones winning value by value."""
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for model, values in (layer or {}).items():
            out.setdefault(model, {}).update(values)
    return out
