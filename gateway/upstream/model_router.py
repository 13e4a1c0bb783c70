"""The model router: one `Upstream` over several (the in-process engine, groups of remote
servers that serve one model each, pools of servers whose models are discovered), each
request going to the one that serves its model. Aliases give served models more public
names: a request under an alias runs as its target (the name the upstream is sent, and
the cache partition: an alias asks the same model the same question), and its response
carries the name the client asked for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import cast
from urllib.parse import urlsplit

from engine.tokenizer import Tokenizer
from gateway.errors import APIError
from gateway.upstream.base import (
    CompletionJob,
    Delta,
    EngineGauges,
    Forwarder,
    Unsupported,
    Upstream,
    UpstreamHealth,
)

LOCAL_OWNER = "semgate"  # /v1/models' owned_by for the models this process runs


class ModelRouter:
    def __init__(self, targets: list[Upstream], aliases: dict[str, str] | None = None) -> None:
        if not targets:
            raise ValueError("ModelRouter needs at least one upstream")
        self.targets = targets
        self.aliases = dict(aliases or {})
        # Early starts are decided per request (cheap_abort_of); this is all of them.
        self.cheap_abort = all(t.cheap_abort for t in targets)
        self.description = " and ".join(dict.fromkeys(t.description for t in targets))
        # The in-process engine (if one runs) must have loaded: ready() says why.
        self._local = [t for t in targets if not t.forwards]
        self.awaited = " or ".join(dict.fromkeys(t.awaited for t in self._local or targets))

    @property
    def forwards(self) -> bool:
        """Whether any model is served by remote servers (which take pass-throughs)."""
        return any(t.forwards for t in self.targets)

    @property
    def unlisted(self) -> bool:
        return any(t.unlisted for t in self.targets)

    def _serving(self, name: str) -> Upstream | None:
        return next((t for t in self.targets if name in t.models()), None)

    def target(self, model: str, param: str = "model") -> tuple[Upstream, str]:
        """What serves `model` (a public name: an alias or a served model) and the name
        it serves it under. 404 `model_not_found` for a model nobody serves; 503 while
        it cannot tell (a server whose models are discovered has not listed them yet)."""
        name = self.aliases.get(model, model)
        if (target := self._serving(name)) is not None:
            return target, name
        if self.unlisted:
            raise APIError(
                503,
                f"The model {model!r} is not listed yet: upstreams are still starting; "
                "retry shortly",
                "service_unavailable",
                "upstreams_starting",
                retry_after=2,
            )
        raise APIError(
            404,
            f"The model {model!r} does not exist; available: {', '.join(self.models())}",
            param=param,
            code="model_not_found",
        )

    def route(self, model: str, param: str = "model") -> str:
        """The name `model` is served under (as target())."""
        return self.target(model, param)[1]

    def remote(self, model: str) -> tuple[Forwarder, str] | None:
        """The servers of `model` and its served name if remote ones serve it; None for
        the in-process engine's."""
        target, name = self.target(model)
        return (cast(Forwarder, target), name) if target.forwards else None

    def cheap_abort_of(self, model: str) -> bool:
        return self.target(model)[0].cheap_abort

    def owner(self, model: str) -> str:
        """/v1/models' owned_by: the remote servers' host:port, or semgate for the
        in-process engine (an alias: its target's)."""
        target, name = self.target(model)
        if not target.forwards:
            return LOCAL_OWNER
        return ",".join(dict.fromkeys(urlsplit(url).netloc for url in target.servers_of(name)))

    def servers_of(self, model: str) -> list[str]:
        target, name = self.target(model)
        return target.servers_of(name)

    async def start(self) -> None:
        """Starts them all; raises the first failure once each has started or failed (the
        others serve meanwhile)."""
        results = await asyncio.gather(*(t.start() for t in self.targets), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def close(self) -> None:
        for target in self.targets:
            await target.close()

    def ready(self) -> bool:
        """The in-process engine loaded and alive, where one runs (chat waits for it as a
        gateway of that model alone would: it is loading, or dead); else any upstream
        up (remote servers come and go; each model's requests get 503 while its are down)."""
        if self._local:
            return all(t.ready() for t in self._local)
        return any(t.ready() for t in self.targets)

    @property
    def failure(self) -> str | None:
        return next((f for t in self.targets if (f := t.failure) is not None), None)

    def tokenizer(self, model: str) -> Tokenizer | None:
        target, name = self.target(model)
        return target.tokenizer(name)

    def models(self) -> list[str]:
        """The served models (the first is the default), then the aliases of those."""
        served = list(dict.fromkeys(m for t in self.targets for m in t.models()))
        aliases = [a for a, name in self.aliases.items() if name in served and a not in served]
        return served + aliases

    def gauges(self) -> EngineGauges | None:
        return next((g for t in self.targets if (g := t.gauges()) is not None), None)

    def health(self) -> list[UpstreamHealth]:
        return [h for t in self.targets for h in t.health()]

    def _job(self, job: CompletionJob) -> tuple[Upstream, CompletionJob]:
        target, name = self.target(job.model)
        return target, job if name == job.model else replace(job, model=name)

    def supports(self, job: CompletionJob) -> Unsupported | None:
        target, job = self._job(job)
        return target.supports(job)

    def refuse_oversized(self, job: CompletionJob) -> None:
        target, job = self._job(job)
        target.refuse_oversized(job)

    def stream(self, job: CompletionJob) -> AsyncGenerator[Delta, None]:
        """The serving upstream's stream of `job` under its served name (no generator of
        its own: no hop per delta). Raises at the call, not at the first delta, for a
        model nobody serves."""
        target, job = self._job(job)
        return target.stream(job)
