"""How upstreams and model aliases are spelled (gateway/settings.py loads them;
gateway/upstream/model_router.py sends each model's requests where they say).

An upstream spec is `URL[,URL...]` (servers whose models are discovered from their
/v1/models) or `MODEL=URL[,URL...]` (a group: servers that serve MODEL under that name,
which is what they are sent). `--upstream` takes one spec and is repeatable;
SEMGATE_UPSTREAMS holds specs separated by `;`; the config file's `upstreams` is a list
of specs or an `[upstreams]` table of MODEL = URL or [URL, ...], or of `[upstreams.MODEL]`
tables of `urls` and the group's own settings (gateway/upstream/group_settings.py). A spec
is a group when an `=` comes before any `://` (every URL has a scheme), so plain URL lists
parse as before. An alias is `PUBLIC=MODEL`: clients ask for PUBLIC, MODEL answers.

Prefill servers (`--upstream-prefill`, SEMGATE_UPSTREAM_PREFILL, the config file's
`upstream_prefill`) are spelled as upstreams are: a group's prefill servers pair with that
model's group, plain URLs with the servers whose models are discovered
(gateway/upstream/disaggregation.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from gateway.upstream.group_settings import from_config

GROUP_SEPARATOR = ";"


def check_url(url: str, what: str) -> str:
    """`url` without a trailing slash; ValueError naming `what` unless http(s)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{what}: {url!r} is not an http(s) URL "
            "(give URL[,URL...] or MODEL=URL[,URL...], one group per spec)"
        )
    return url.rstrip("/")


def _urls(text: str, what: str) -> list[str]:
    urls = [check_url(u.strip(), what) for u in text.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"{what}: no URL in {text!r}")
    return urls


def parse_upstreams(specs: Iterable[str], what: str) -> dict[str, Any]:
    """Specs (each may hold several, `;`-separated) -> the settings `upstreams` (plain
    URLs) and `upstream_groups` (model -> URLs), both always set: a source that names
    upstreams replaces every upstream of the sources before it. A model given twice
    gets the URLs of both."""
    plain: list[str] = []
    groups: dict[str, list[str]] = {}
    for spec in (s.strip() for text in specs for s in text.split(GROUP_SEPARATOR)):
        if not spec:
            continue
        head, sep, rest = spec.partition("=")
        if sep and "://" not in head:
            model = head.strip()
            if not model:
                raise ValueError(f"{what}: a group needs a model name before '=', got {spec!r}")
            groups.setdefault(model, []).extend(_urls(rest, what))
        else:
            plain.extend(_urls(spec, what))
    return {"upstreams": plain, "upstream_groups": groups}


def as_prefill(parsed: dict[str, Any], what: str) -> dict[str, Any]:
    """`parse_upstreams`' (or `upstreams_from_toml`'s) answer as the settings of prefill
    servers: `upstream_prefill` (plain URLs) and `upstream_prefill_groups`. They take the
    settings of the upstreams they prefill for, none of their own."""
    if parsed.get("upstream_settings"):
        raise ValueError(f"{what}: prefill servers take their model's upstream group settings")
    return {
        "upstream_prefill": parsed["upstreams"],
        "upstream_prefill_groups": parsed["upstream_groups"],
    }


def upstreams_from_toml(value: object, what: str) -> dict[str, Any]:
    """The config file's `upstreams`: a list of specs, or a table of groups (each its
    URLs, or a table of `urls` and its own settings: `upstream_settings`)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return parse_upstreams(value, what)
    if isinstance(value, dict):
        specs = []
        settings = {}
        for model, group in value.items():
            urls = group.get("urls") if isinstance(group, dict) else group
            urls = [urls] if isinstance(urls, str) else urls
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ValueError(
                    f"{what}: {model} must be a URL, a list of URLs or a table with `urls`"
                )
            specs.append(f"{model}={','.join(urls)}")
            if isinstance(group, dict) and (own := from_config(model, group, what)):
                settings[model] = own
        return {**parse_upstreams(specs, what), "upstream_settings": settings}
    raise ValueError(f"{what} must be a list of URLs or a table of model = [URLs]")


def parse_aliases(specs: Iterable[str], what: str) -> dict[str, str]:
    """`PUBLIC=MODEL` specs (each may hold several, comma-separated) -> public -> model."""
    aliases: dict[str, str] = {}
    for spec in (s.strip() for text in specs for s in text.split(",")):
        if not spec:
            continue
        public, sep, model = (part.strip() for part in spec.partition("="))
        if not sep:
            raise ValueError(f"{what} must look like PUBLIC=MODEL, got {spec!r}")
        aliases[public] = model
    return aliases


def check_upstreams(
    upstreams: list[str], groups: dict[str, list[str]], aliases: dict[str, str]
) -> tuple[list[str], dict[str, list[str]]]:
    """The upstreams with their URLs checked and normalised; ValueError for a group or
    an alias the model router cannot follow (empty names, no URLs, an alias of an alias
    or of itself, an alias named as a group's model)."""
    plain = [check_url(u.strip(), "upstreams") for u in upstreams if u.strip()]
    checked: dict[str, list[str]] = {}
    for model, urls in groups.items():
        if not model or not urls:
            raise ValueError(f"upstream group {model!r} needs a model name and a URL")
        checked[model] = list(dict.fromkeys(check_url(u, f"upstream group {model}") for u in urls))
    for public, model in aliases.items():
        if not isinstance(model, str) or not public or not model:
            raise ValueError(f"model alias {public!r} = {model!r}: both names must be given")
        if model in aliases:  # which also refuses PUBLIC=PUBLIC
            raise ValueError(f"model alias {public}={model}: {model} is an alias itself")
        if public in checked:
            raise ValueError(f"model alias {public}: {public} is an upstream group's model")
    return plain, checked
