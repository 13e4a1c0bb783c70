"""A small OpenAI-compatible server for the pass-through tests, in a thread of the test
process: it answers tool calls (whole, or as streamed tool-call deltas), structured
outputs, logprobs and n > 1, text completions (/v1/completions: `COMPLETION`),
embeddings (/v1/embeddings: `EMBEDDING` for each input), and records every body it
receives, and each one's X-Request-Id. A body naming `x_status` gets that status with an
OpenAI error (vLLM-style: an unknown field that only a server behind the gateway reads);
one naming `x_drop` has its connection closed with no answer, as a server that dies
while it generates; one whose text holds `TOO_LONG` is refused as over the context, as
vLLM refuses it (`VLLM_TOO_LONG`) or llama-server (`LLAMA_TOO_LONG`). Chat answers name
the model they were sent; /v1/models lists the fake's `models`. With `llama`, it answers
as llama.cpp's llama-server does: /health and /ready say `{"status": "ok"}`, answers
name its GGUF file (`GGUF`), and a stream's last chunk has llama-server's `timings`
(`LLAMA_TIMINGS`) and no Server-Timing header. With `prefill`, it answers as a vLLM
prefill server (a KV connector's): a request whose `kv_transfer_params` ask
`do_remote_decode` gets `PREFILL_PARAMS` in its JSON answer. While `failing` holds a
status, every POST gets it with an OpenAI error, and each is answered `delay` seconds
late; while `waiting` holds a count, /metrics exports it as vLLM's waiting requests (else
/metrics is a 404, and the gateway asks no more)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cache.redis_server import free_port

MODEL = "fake-model"
ARGUMENTS = '{"a": 6, "b": 7}'  # every tool call's
STRUCTURED = {"city": "Paris", "country": "France"}  # every structured output's
SERVER_TIMING = "queue;dur=1.5, prefill;dur=2.5, decode;dur=3.5"
COMPLETION = " Paris, of course."  # every text completion's
EMBEDDING = [0.6, 0.8]  # every embedding's
ERROR = {"message": "I'm a teapot", "type": "invalid_request_error", "param": None, "code": "x"}
# What vLLM's NixlConnector answers a prefill for a decode server elsewhere.
PREFILL_PARAMS = {
    "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "fake-prefill",
    "remote_block_ids": [1, 2, 3], "remote_host": "127.0.0.1", "remote_port": 5600,
    "tp_size": 1,
}  # fmt: skip
GGUF = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
TOO_LONG = "x-too-long"
LLAMA_TOO_LONG = {"code": 400, "message": "the request exceeds the available context size, try "
                  "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 9000,
                  "n_ctx": 4096}  # fmt: skip
VLLM_TOO_LONG = {
    "message": "This model's maximum context length is 4096 tokens. However, you "
    "requested 9000 tokens.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
LLAMA_TIMINGS = {
    "cache_n": 36, "prompt_n": 1, "prompt_ms": 12.5, "prompt_per_token_ms": 12.5,
    "prompt_per_second": 80.0, "predicted_n": 7, "predicted_ms": 116.6,
    "predicted_per_token_ms": 16.7, "predicted_per_second": 60.0,
}  # fmt: skip


def _message(body: dict[str, Any], index: int) -> tuple[dict[str, Any], str]:
    """The answer's message for choice `index`, and its finish_reason."""
    tools = body.get("tools")
    if tools and body.get("tool_choice") != "none":
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": tools[0]["function"]["name"], "arguments": ARGUMENTS},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    if (body.get("response_format") or {}).get("type") in ("json_object", "json_schema"):
        return {"role": "assistant", "content": json.dumps(STRUCTURED)}, "stop"
    return {"role": "assistant", "content": f"Answer {index} from the fake."}, "stop"


def _logprobs(body: dict[str, Any], text: str) -> dict[str, Any] | None:
    if not body.get("logprobs"):
        return None
    return {"content": [{"token": text, "logprob": -0.25, "bytes": None, "top_logprobs": []}]}


def _chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "finish_reason": None, **extra}
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
            "model": MODEL, "choices": [choice]}  # fmt: skip


def _chunks(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The streamed answer: per choice, the role, then the tool call's deltas (its id and
    name, then its arguments in two pieces) or the content word by word, then the
    finish_reason; the usage last if asked."""
    for index in range(body.get("n") or 1):
        message, finish = _message(body, index)
        yield _chunk(index, {"role": "assistant", "content": ""})
        for call in message.get("tool_calls") or []:
            head = {"index": 0, "id": call["id"], "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": ""}}  # fmt: skip
            yield _chunk(index, {"tool_calls": [head]})
            half = len(ARGUMENTS) // 2
            for piece in (ARGUMENTS[:half], ARGUMENTS[half:]):
                yield _chunk(
                    index, {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                )
        for word in (message["content"] or "").split(" "):
            yield _chunk(index, {"content": word + " "}, logprobs=_logprobs(body, word))
        final = _chunk(index, {})
        final["choices"][0]["finish_reason"] = finish
        yield final
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        yield {**_chunk(0, {}), "choices": [], "usage": usage}


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    choices = []
    for index in range(body.get("n") or 1):
        message, finish = _message(body, index)
        logprobs = _logprobs(body, message["content"] or "")
        choices.append(
            {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
        )
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": choices, "usage": usage}  # fmt: skip


def _text_completions(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A text completion (`object: text_completion`, as OpenAI streams it too): whole, or
    word by word then the finish_reason, and the usage last if asked."""
    usage = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    head = {"id": "cmpl-fake", "object": "text_completion", "created": 1, "model": MODEL}

    def choice(text: str, finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                     "finish_reason": finish}]}  # fmt: skip

    if not body.get("stream"):
        yield {**choice(COMPLETION, "stop"), "usage": usage}
        return
    for word in COMPLETION.split(" ")[1:]:
        yield choice(" " + word)
    yield choice("", "stop")
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**head, "choices": [], "usage": usage}


class FakeUpstream:
    """Serves on a free loopback port while entered; `bodies` holds each body posted."""

    def __init__(
        self, models: tuple[str, ...] = (MODEL,), llama: bool = False, prefill: bool = False
    ) -> None:
        self.models = models
        self.llama = llama
        self.prefill = prefill
        self.failing: int | None = None
        self.delay = 0.0
        self.waiting: int | None = None
        self.bodies: list[dict[str, Any]] = []
        self.request_ids: list[str | None] = []
        self.port = free_port()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _send(self, status: int, payload: object, **headers: str) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if fake.llama and self.path in ("/health", "/ready"):
                    self._send(200, {"status": "ok"})
                elif self.path == "/health":
                    self._send(200, {})
                elif self.path == "/v1/models":
                    data = [{"id": model, "object": "model"} for model in fake.models]
                    self._send(200, {"object": "list", "data": data})
                elif self.path == "/metrics" and fake.waiting is not None:
                    data = f'vllm:num_requests_waiting{{model_name="{MODEL}"}} {fake.waiting}\n'
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data.encode())
                else:  # no /ready: the gateway asks /health and /v1/models
                    self._send(404, {"error": ERROR})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                fake.request_ids.append(self.headers.get("X-Request-Id"))
                time.sleep(fake.delay)
                answered = GGUF if fake.llama else body["model"]
                asked = body.get("kv_transfer_params") or {}
                transfer = {}
                if fake.prefill and asked.get("do_remote_decode"):
                    transfer = {"kv_transfer_params": PREFILL_PARAMS}
                if fake.failing is not None:
                    self._send(fake.failing, {"error": ERROR})
                elif "x_drop" in body:
                    self.close_connection = True
                elif "x_status" in body:
                    self._send(body["x_status"], {"error": ERROR}, Retry_After="7")
                elif TOO_LONG in json.dumps([body.get(f) for f in ("messages", "prompt", "input")]):
                    self._send(400, {"error": LLAMA_TOO_LONG if fake.llama else VLLM_TOO_LONG})
                elif self.path == "/v1/completions":
                    self._stream(_text_completions(body), bool(body.get("stream")), transfer)
                elif self.path == "/v1/embeddings":
                    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    data = [{"object": "embedding", "embedding": EMBEDDING, "index": i}
                            for i in range(len(inputs))]  # fmt: skip
                    usage = {"prompt_tokens": len(inputs), "total_tokens": len(inputs)}
                    answer = {"object": "list", "data": data, "model": body["model"]}
                    self._send(200, {**answer, "usage": usage})
                elif not body.get("stream"):
                    answer = {**_completion(body), "model": answered, **transfer}
                    self._send(
                        200, answer, **({} if fake.llama else {"Server_Timing": SERVER_TIMING})
                    )
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    if not fake.llama:
                        self.send_header("Server-Timing", SERVER_TIMING)
                    self.end_headers()
                    chunks = list(_chunks(body))
                    if fake.llama:
                        chunks[-1]["timings"] = LLAMA_TIMINGS
                    for chunk in chunks:
                        chunk["model"] = answered
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")

            def _stream(
                self, events: Iterator[dict[str, Any]], stream: bool, transfer: dict[str, Any]
            ) -> None:
                if not stream:
                    self._send(200, {**next(events), **transfer})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event in events:
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        return Handler
