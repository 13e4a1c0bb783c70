"""One remote server as its pool's health checks see it (gateway/upstream/http.py checks
each of its servers every few seconds): whether it is ready, which models it serves, and
its engine's load."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import httpx

from gateway.upstream.balancer import Backend
from gateway.upstream.remote_load import UNKNOWN_LOAD, RemoteLoad, parse_load

logger = logging.getLogger(__name__)


@dataclass
class RemoteServer:
    base: str
    backend: Backend  # the server as the balancer sees it
    healthy: bool = False
    models: list[str] = field(default_factory=list)
    error: str = "not probed yet"
    # semgate's /ready lists the models too; servers without it (vLLM) are asked
    # /health and /v1/models instead, from their first 404 on. A /ready that answers
    # otherwise than semgate's (llama-server's `{"status": "ok"}`) says alive, and the
    # models come from /v1/models.
    ready_path: str | None = "/ready"
    # Its engine's load from its /metrics (None: unknown); asked no more after a 404.
    load: RemoteLoad = UNKNOWN_LOAD
    metrics_path: str | None = "/metrics"

    async def probe_models(self, client: httpx.AsyncClient, timeout: float) -> list[str]:
        """The served models if the server is ready; raises otherwise. One request to a
        semgate server, two to any other."""
        if self.ready_path is not None:
            resp = await client.get(self.base + self.ready_path, timeout=timeout)
            if resp.status_code == 404:
                self.ready_path = None
            else:
                resp.raise_for_status()
                if (models := _semgate_models(resp)) is not None:
                    return models
        if self.ready_path is None:
            resp = await client.get(f"{self.base}/health", timeout=timeout)
            resp.raise_for_status()
        resp = await client.get(f"{self.base}/v1/models", timeout=timeout)
        resp.raise_for_status()
        return [m["id"] for m in resp.json()["data"]]

    async def probe_load(self, client: httpx.AsyncClient, timeout: float) -> RemoteLoad:
        """Its engine's running and waiting requests, if its /metrics says. A server
        without /metrics (404) is not asked again; any other failure leaves it unknown
        this round and never marks the server down (it answered its health check)."""
        if self.metrics_path is None:
            return UNKNOWN_LOAD
        try:
            resp = await client.get(self.base + self.metrics_path, timeout=timeout)
            if resp.status_code == 404:
                self.metrics_path = None
            resp.raise_for_status()
            return parse_load(resp.text)
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("upstream %s: no load from /metrics: %r", self.base, exc)
            return UNKNOWN_LOAD


def _semgate_models(resp: httpx.Response) -> list[str] | None:
    """The models a semgate /ready lists; None for any other server's answer."""
    try:
        body = resp.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(models := body.get("models"), list):
        return None
    return [str(m) for m in models]
