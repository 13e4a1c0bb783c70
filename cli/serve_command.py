"""`semgate serve`: the gateway over HTTP (uvicorn)."""

from __future__ import annotations

import argparse
import faulthandler
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from cli.engine_flags import add_engine_flags

if TYPE_CHECKING:
    from gateway.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    from gateway.settings import FLAT_SETTINGS, Settings, parse_pairs
    from gateway.upstream.group_settings import parse_group_settings
    from gateway.upstream.specs import as_prefill, parse_aliases, parse_upstreams

    # Flags named like a setting (the engine's too) pass straight through (None: not
    # given); the rest are spelled for the command line.
    given = vars(args)
    direct = {name: given[name] for name in FLAT_SETTINGS if name in given}
    upstreams = parse_upstreams(args.upstream, "--upstream") if args.upstream else {}
    if specs := args.upstream_prefill_specs:
        what = "--upstream-prefill"
        upstreams.update(as_prefill(parse_upstreams(specs, what), what))
    aliases = parse_aliases(args.model_alias, "--model-alias") if args.model_alias else None
    groups = args.upstream_setting_specs
    return Settings.load(
        args.config,
        **direct,
        **upstreams,
        upstream_settings=parse_group_settings(groups, "--upstream-setting") if groups else None,
        model_aliases=aliases,
        api_keys=parse_pairs(args.api_key_pairs, "--api-keys") if args.api_key_pairs else None,
        cache=False if args.no_cache else None,
    )


def _check_port(host: str, port: int) -> None:
    """Refuses a port that cannot be listened on now, before anything slow starts (and
    before an admin key is printed for a server that will not run)."""
    family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.client_limits import ClientLimits, limited_protocol
    from gateway.drain import LAST_RESORT_SECONDS, DrainingServer
    from gateway.serve_logging import AccessLog, configure_logging

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    settings = _settings(args)
    configure_logging(settings.log_format)
    _check_port(settings.host, settings.port)
    app = create_app(settings)
    runtime = app.state.runtime
    limits = ClientLimits(
        max_header_bytes=settings.max_header_bytes,
        max_headers=settings.max_headers,
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        max_connections=settings.max_connections,
    )
    config = uvicorn.Config(
        AccessLog(app),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        log_config=None,  # uvicorn's loggers write through ours (gateway/serve_logging.py)
        access_log=False,  # AccessLog writes one line a request instead
        # The drain (gateway/drain.py) ends what runs at the grace; this is a last resort.
        # The ignores: uvicorn types these int, and uses them as seconds (wait_for,
        # call_later), where a fraction works as well.
        timeout_graceful_shutdown=settings.shutdown_grace + LAST_RESORT_SECONDS,  # type: ignore[arg-type]
        timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
        # C event loop and HTTP parser (project dependencies): the event loop's CPU is
        # what every request costs beside the engine, and both share two cores here. The
        # parser with the limits on what a client may send (gateway/client_limits.py).
        loop="uvloop",
        http=limited_protocol(limits, runtime.metrics.count_refusal),
    )
    DrainingServer(config, runtime.drain).run()
    return 0


ROUTING_POLICIES = ("round_robin", "least_load", "prefix")  # gateway/upstream/balancer.py's


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve the OpenAI-compatible gateway over HTTP",
        description="Settings: defaults < --config FILE < SEMGATE_* environment < flags.",
    )
    serve.add_argument("--config", type=Path, default=None, help="TOML settings file")
    serve.add_argument("--host", default=None, help="(default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="(default: 8000)")
    add_engine_flags(serve)
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=None,
        help="seconds requests in flight get to finish after SIGTERM (default: 30.0)",
    )
    serve.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="the most tokens an answer gets when its request sets no max_tokens; 0: up "
        "to the context (default: 1024)",
    )
    serve.add_argument(
        "--upstream",
        action="append",
        default=None,
        metavar="[MODEL=]URL[,URL...]",
        help="forward misses to these OpenAI-compatible servers instead of a local engine: "
        "their models are discovered, or MODEL= names the one they serve; repeatable",
    )
    serve.add_argument(
        "--upstream-prefill",
        dest="upstream_prefill_specs",  # parsed into upstream_prefill(_groups)
        action="append",
        default=None,
        metavar="[MODEL=]URL[,URL...]",
        help="prefill servers (vLLM's P/D protocol) for MODEL's --upstream servers, which "
        "then decode (without MODEL=: for the upstreams whose models are discovered); "
        "repeatable",
    )
    serve.add_argument(
        "--pd-min-prompt-tokens",
        type=int,
        default=None,
        help="prefill on a prefill server only prompts whose tokens not cached on the "
        "decode servers exceed this many (default: 1024)",
    )
    serve.add_argument(
        "--pd-max-prefill-queue",
        type=int,
        default=None,
        help="prefill locally while the prefill servers have this many requests queued "
        "per healthy server, or more (default: 2)",
    )
    serve.add_argument(
        "--pd-prefill-timeout",
        type=float,
        default=None,
        help="seconds a prefill server may take before the decode server prefills the "
        "prompt itself (default: 60.0, at most --upstream-timeout)",
    )
    serve.add_argument(
        "--pd-failure-backoff",
        type=float,
        default=None,
        help="seconds every prompt is prefilled locally after a remote prefill failed or "
        "answered without kv_transfer_params; 0: none (default: 10.0)",
    )
    serve.add_argument(
        "--model-alias",
        action="append",
        default=None,
        metavar="PUBLIC=MODEL",
        help="let clients ask for MODEL as PUBLIC too; repeatable",
    )
    serve.add_argument(
        "--local-engine",
        action="store_true",
        default=None,
        help="run the in-process engine (--model) beside the upstreams",
    )
    serve.add_argument(
        "--upstream-policy",
        choices=ROUTING_POLICIES,
        default=None,
        help="how each group's servers share its requests (default: prefix, balanced by load)",
    )
    serve.add_argument(
        "--upstream-balance-threshold",
        type=float,
        default=None,
        help="prefix: requests by which the prefix's server may exceed the least-loaded one's "
        "load before the least-loaded one answers (default: 2.0)",
    )
    serve.add_argument(
        "--upstream-session-affinity",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep a session (X-Session-Id, else `user`) on its server (default: on)",
    )
    serve.add_argument(
        "--upstream-prefix-capacity",
        type=int,
        default=None,
        help="prefix: about how many prompt tokens each server's prefix cache holds, "
        "what the gateway remembers of it (default: 500000)",
    )
    serve.add_argument(
        "--upstream-timeout",
        type=float,
        default=None,
        help="seconds a request may take (default: 600.0)",
    )
    serve.add_argument(
        "--upstream-api-key", default=None, help="bearer key sent to the upstreams (default: none)"
    )
    serve.add_argument(
        "--upstream-setting",
        dest="upstream_setting_specs",  # parsed into upstream_settings
        action="append",
        default=None,
        metavar="MODEL:NAME=VALUE",
        help="one upstream group's own setting (policy, balance_threshold, session_affinity, "
        "prefix_capacity, timeout, api_key, weights=W,W,...); repeatable",
    )
    serve.add_argument(
        "--upstream-header",
        action="store_true",
        default=None,
        help="name the server that answered in an X-Upstream response header",
    )
    serve.add_argument("--no-cache", action="store_true", help="serve without the cache")
    serve.add_argument(
        "--redis-url",
        default=None,
        help="redis://HOST:PORT/DB, or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE/DB "
        "for the primary Redis Sentinel names (default: an embedded Redis Stack)",
    )
    serve.add_argument(
        "--redis-data-dir",
        type=Path,
        default=None,
        help="the embedded Redis's files (default: ~/.local/share/semgate/redis)",
    )
    serve.add_argument(
        "--threshold", type=float, default=None, help="similarity in [0, 1] (default: 0.6)"
    )
    serve.add_argument(
        "--cache-ttl", type=int, default=None, help="seconds (default: 604800, 7 days)"
    )
    serve.add_argument(
        "--admin-key",
        default=None,
        help="empty: no admin API (default: generated for the run, written to a file only "
        "this user can read, whose path is logged)",
    )
    serve.add_argument(
        "--api-keys",
        dest="api_key_pairs",  # parsed into api_keys, so not passed through by name
        default=None,
        metavar="KEY:TENANT,...",
        help="default: chat is open",
    )
    serve.add_argument(
        "--rate-limit",
        default=None,
        metavar="N/UNIT",
        help="per key, e.g. 60/minute (default: off)",
    )
    serve.add_argument(
        "--admin-rate-limit",
        default=None,
        metavar="N/UNIT",
        help="the admin key's own limit (default: off)",
    )
    serve.add_argument(
        "--failed-auth-rate-limit",
        default=None,
        metavar="N/UNIT",
        help="per client address, for requests with a missing or unknown key, whatever "
        "--rate-limit is; empty: off (default: 60/minute)",
    )
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="text: one line a record; json: one object a line (default: text)",
    )
    serve.set_defaults(func=cmd_serve)
