"""Every error path answers in the OpenAI error shape with the right status, through the
openai SDK's exception classes and raw HTTP."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from gateway.embeddings import BUNDLED_NAME as EMBEDDER
from gateway.errors import APIError
from gateway.schemas import ChatCompletionRequest
from gateway.strict_json import decode_strict
from tests.gateway.conftest import ADMIN, ALICE, chat_body, messages, seed
from tests.gateway.fake_upstream import MODEL as FAKE_MODEL
from tests.gateway.fake_upstream import TOO_LONG
from tests.gateway.servers import MODEL, Server, metric, wait_for_idle_engine


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    assert response.headers["x-request-id"]
    return error


HI = b'[{"role": "user", "content": "Hi"}]'  # a valid `messages`


@pytest.mark.parametrize(
    ("content", "status", "param", "code"),
    [
        (b'{"model": "x", "messages": [', 400, None, "invalid_json"),
        (b"", 400, None, "missing_body"),
        # As OpenAI answers them (the openai SDK's BadRequestError, not a 422's
        # UnprocessableEntityError), with the field and what is wrong with it.
        (b'{"model": 3, "messages": ' + HI + b"}", 400, "model", "invalid_type"),
        (b'{"model": "m", "messages": "hello"}', 400, "messages", "invalid_type"),
        (b'{"messages": ' + HI + b"}", 400, "model", "missing_required_parameter"),
        (b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}', 400,
         "messages[0].role", "invalid_value"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', 400, "messages[0].role",
         "missing_required_parameter"),
        # Strict types: strings are never coerced into numbers or booleans.
        (b'{"model": "m", "messages": ' + HI + b', "temperature": "0.5"}', 400, "temperature",
         "invalid_type"),
        (b'{"model": "m", "messages": ' + HI + b', "max_tokens": "4"}', 400, "max_tokens",
         "invalid_type"),
        (b'{"model": "m", "messages": ' + HI + b', "stream": "true"}', 400, "stream",
         "invalid_type"),
        # Not UTF-8, and nested past any parser's recursion limit: 400, never a 500.
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None,
         "invalid_json"),
        (b'{"model": "m", "messages": ' + HI + b', "tools": [' + b'{"a": ' * 100_000 + b"1"
         + b"}" * 100_000 + b"]}", 400, None, "invalid_json"),
    ],
    ids=["malformed", "empty-body", "wrong-type", "messages-not-list", "no-model", "bad-role",
         "no-role", "string-temperature", "string-max-tokens", "string-stream", "not-utf8",
         "deep"],
)  # fmt: skip
def test_malformed_and_mistyped_bodies(
    http: httpx.Client, content: bytes, status: int, param: str | None, code: str
):
    response = http.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json"}
    )
    error = assert_error(response, status)
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)


def test_the_openai_sdk_gets_a_bad_request_naming_the_field(alice: openai.OpenAI):
    """A 422 made the SDK raise UnprocessableEntityError, which OpenAI never sends."""
    with pytest.raises(openai.BadRequestError) as refused:
        alice.chat.completions.create(
            model=MODEL, messages=messages("Hi"), extra_body={"temperature": "hot"}
        )
    assert refused.value.param == "temperature" and refused.value.code == "invalid_type"


UNSUPPORTED = "unsupported_value"  # what this engine cannot do: OpenAI's code for it


@pytest.mark.parametrize(
    ("overrides", "param", "code"),
    [
        ({"messages": []}, "messages", None),
        ({"n": 2}, "n", UNSUPPORTED),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", UNSUPPORTED),
        ({"logprobs": True}, "logprobs", UNSUPPORTED),
        ({"temperature": 3}, "temperature", None),
        ({"max_tokens": 0}, "max_tokens", None),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", None),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages",
         UNSUPPORTED),
        ({"messages": [{"role": "tool", "tool_call_id": "c", "content": "42"}]}, "messages",
         UNSUPPORTED),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format",
         UNSUPPORTED),
        ({"repetition_penalty": 1.2}, "repetition_penalty", UNSUPPORTED),
        # A user's content must be text: null and no parts are alike refused.
        ({"messages": [{"role": "user", "content": None}]}, "messages", None),
        ({"messages": [{"role": "user", "content": []}]}, "messages", None),
    ],
    ids=["empty-messages", "n", "tools", "logprobs", "temperature", "max-tokens", "stop", "image",
         "tool-message", "json-schema", "repetition-penalty", "null-content",
         "no-parts"],
)  # fmt: skip
def test_values_the_engine_cannot_honour(
    http: httpx.Client, overrides: dict, param: str, code: str | None
):
    response = http.post("/v1/chat/completions", json=chat_body("Hi", **overrides))
    error = assert_error(response, 400)
    assert (error["param"], error["code"]) == (param, code)


def test_top_k_is_honoured_by_the_engine_and_never_cached(http: httpx.Client):
    """top_k reaches the sampler: top_k=1 keeps only the likeliest token, so even at
    temperature 1 the answer is the greedy one. The cache does not key it: a bypass."""
    question = "Name three colours of the rainbow."
    body = chat_body(question, max_tokens=12, temperature=1.0, seed=5, top_k=1)
    sampled = [http.post("/v1/chat/completions", json=body) for _ in range(2)]
    greedy = http.post(
        "/v1/chat/completions",
        json=chat_body(question, max_tokens=12),
        headers={"Cache-Control": "no-store"},
    )
    for response in [*sampled, greedy]:
        assert response.status_code == 200, response.text
    for response in sampled:
        assert response.headers["x-cache-status"] == "Bypass"
        assert response.headers["x-cache-bypass-reason"] == "top_k"
        assert response.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


def test_whole_floats_are_integers(http: httpx.Client):
    """JSON has one number type: 4.0 for max_tokens is 4, as JSON Schema reads it."""
    response = http.post("/v1/chat/completions", json=chat_body("Hi", max_tokens=4.0, seed=7.0))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 4
    fraction = http.post("/v1/chat/completions", json=chat_body("Hi", max_tokens=4.5))
    assert assert_error(fraction, 400)["param"] == "max_tokens"


def test_an_assistants_empty_content_is_empty_text(http: httpx.Client):
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": []},
        {"role": "user", "content": "Hi again"},
    ]
    response = http.post("/v1/chat/completions", json=chat_body("Hi", messages=turns))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ('"temperature": 2.5', 400, "temperature"),
        ('"temperature": -0.1', 400, "temperature"),
        ('"top_p": 0', 400, "top_p"),
        ('"top_p": 1.5', 400, "top_p"),
        ('"max_tokens": 0', 400, "max_tokens"),
        ('"max_completion_tokens": 0', 400, "max_completion_tokens"),
        ('"seed": -1', 400, "seed"),
        ('"seed": 18446744073709551616', 400, "seed"),
        ('"stop": ""', 400, "stop"),
        ('"stop": ["a", "b", "c", "d", "e"]', 400, "stop"),
        ('"stop": ["a", ""]', 400, "stop[1]"),
        ('"cache": {"ttl": 0}', 400, "cache.ttl"),
        ('"temperature": "0.5"', 400, "temperature"),
        ('"stop": 3', 400, "stop"),
    ],
)
def test_values_out_of_range_and_wrong_types_are_400(fields: str, status: int, param: str):
    """The request's limits are constraints on its fields, checked as the body is decoded."""
    hi = '{"role": "user", "content": "Hi"}'
    body = f'{{"model": "m", "messages": [{hi}], {fields}}}'.encode()
    with pytest.raises(APIError) as refused:
        decode_strict(body, ChatCompletionRequest)
    assert (refused.value.status, refused.value.param) == (status, param)
    assert refused.value.type == "invalid_request_error"


def test_values_within_the_limits_are_decoded():
    body = (
        b'{"model": "m", "messages": ' + HI + b', "temperature": 0, "top_p": 1, "max_tokens": 1,'
        b' "seed": 9223372036854775807, "stop": ["a", "b", "c", "d"], "cache": {"ttl": 1}}'
    )
    request = decode_strict(body, ChatCompletionRequest)
    assert (request.temperature, request.top_p, request.stop) == (0, 1, ["a", "b", "c", "d"])


def test_sdk_raises_the_matching_exceptions(alice: openai.OpenAI, gateway: Server):
    with pytest.raises(openai.NotFoundError) as not_found:
        alice.chat.completions.create(model="gpt-4o", messages=messages("Hi"))
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        alice.chat.completions.create(model=MODEL, messages=messages("hello " * 9000))
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        alice.chat.completions.create(model=MODEL, messages=messages("Hi"), max_tokens=10_000)
    anonymous = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.chat.completions.create(model=MODEL, messages=messages("Hi"))


def test_a_hit_refuses_a_max_tokens_past_the_context_as_a_miss_does(
    alice: openai.OpenAI, admin: httpx.Client
):
    """A cached answer was served (200) to a request a miss refuses (400)."""
    admin.delete("/admin/cache", params={"tenant": "alice"}).raise_for_status()
    seed(admin, "What colour is the sky?", "Blue.", "alice")
    question = messages("What colour is the sky?")
    hit = alice.chat.completions.with_raw_response.create(model=MODEL, messages=question)
    assert hit.headers["x-cache-status"] == "Hit"
    with pytest.raises(openai.BadRequestError) as too_long:
        alice.chat.completions.create(model=MODEL, messages=question, max_tokens=10_000)
    assert (too_long.value.code, too_long.value.param) == ("context_length_exceeded", "max_tokens")


def test_a_vllm_context_refusal_passes_in_openais_words(fake_front: Server):
    """vLLM says it in OpenAI's words with its HTTP status as the `code`."""
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": TOO_LONG}]}
    answer = httpx.post(fake_front.url + "/v1/chat/completions", json=body, timeout=30)
    error = assert_error(answer, 400, "context_length_exceeded")
    assert error["param"] == "messages" and "maximum context length" in error["message"]


def test_missing_key_and_oversized_body(gateway: Server, http: httpx.Client):
    missing = httpx.post(gateway.url + "/v1/chat/completions", json=chat_body("Hi"))
    assert assert_error(missing, 401)["type"] == "authentication_error"
    huge = {**chat_body("Hi"), "padding": "x" * (5 * 1024 * 1024)}
    assert_error(http.post("/v1/chat/completions", json=huge), 413)


def test_many_empty_messages_are_refused_by_their_number(http: httpx.Client):
    """100,000 empty messages (3.3 MB, no characters to count): every template adds at
    least a token a message, so they are refused before the cache or the tokenizer
    sees them (they took the event loop for 1.6-2.1 s; docs/benchmarks.md)."""
    body = {**chat_body("Hi"), "messages": [{"role": "user", "content": ""}] * 100_000}
    error = assert_error(http.post("/v1/chat/completions", json=body), 400)
    assert error["code"] == "context_length_exceeded"
    assert "at least 99999 tokens" in error["message"]


def test_unknown_route_and_method(http: httpx.Client):
    assert_error(http.get("/v1/nothing-here"), 404)
    assert_error(http.get("/v1/chat/completions"), 405)


def test_models(alice: openai.OpenAI, http: httpx.Client):
    """The chat model (the default) and the embedder that /v1/embeddings serves."""
    assert [m.id for m in alice.models.list()] == [MODEL, EMBEDDER]
    assert alice.models.retrieve(MODEL).id == MODEL
    assert alice.models.retrieve(EMBEDDER).owned_by == "semgate"
    assert alice.embeddings.create(model=EMBEDDER, input="hi").model.startswith(EMBEDDER)
    assert_error(http.get("/v1/models/not-a-model"), 404, "model_not_found")


def test_health_ready_schema_and_request_ids(gateway: Server):
    assert httpx.get(gateway.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/ready")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "models": [MODEL],
        "cache": "up",
        "upstreams": [{"name": "in-process", "up": True}],
    }
    schema = httpx.get(gateway.url + "/schema/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"] and "/admin/cache/threshold" in schema["paths"]
    given = httpx.get(gateway.url + "/health", headers={"x-request-id": "trace-42"})
    assert given.headers["x-request-id"] == "trace-42"


def test_metrics_follow_vllm_names(gateway: Server, alice: openai.OpenAI):
    counted = (
        f'semgate_time_to_first_token_seconds_count{{model_name="{MODEL}",cache_status="miss"}}',
        f'semgate_e2e_request_latency_seconds_count{{model_name="{MODEL}",cache_status="miss"}}',
        f'semgate_generation_tokens_total{{model_name="{MODEL}"}}',
        "semgate_cache_misses_total",
    )
    before = [metric(gateway, sample, missing=0) for sample in counted]
    question = f"Say hi to visitor {uuid.uuid4().hex[:8]}."  # a certain miss
    alice.chat.completions.create(model=MODEL, messages=messages(question), max_tokens=8)
    after = [metric(gateway, sample) for sample in counted]
    assert after[:2] == [n + 1 for n in before[:2]] and after[3] == before[3] + 1
    assert after[2] > before[2]  # the answer's tokens, counted for its model
    text = httpx.get(gateway.url + "/metrics").text
    for name in (
        "semgate_time_to_first_token_seconds_bucket",
        "semgate_inter_token_latency_seconds_bucket",
        "semgate_e2e_request_latency_seconds_bucket",
        "semgate_num_requests_running",
        "semgate_num_requests_waiting",
        "semgate_kv_cache_usage_perc",
        "semgate_prefix_cache_queries_total",
        "semgate_prefix_cache_hits_total",
        "semgate_cache_hits_total",
        "semgate_cache_misses_total",
        "semgate_cache_bypasses_total",
        "semgate_cache_coalesced_total",
        "semgate_num_preemptions_total",
        'semgate_cache_best_similarity_bucket{le="+Inf"}',
        'semgate_http_requests_total{path="/v1/chat/completions",status="200"}',
        f'semgate_num_requests_running{{model_name="{MODEL}"}}',
        'semgate_upstream_up{upstream="in-process"} 1.0',
    ):
        assert name in text, name
    # Every response is counted by its route's template, unrouted ones as `unmatched`.
    httpx.get(gateway.url + "/no-such-page")
    assert metric(gateway, 'semgate_http_requests_total{path="unmatched",status="404"}') >= 1
    response = httpx.get(gateway.url + "/metrics")
    assert response.headers["content-type"].count("charset") == 1
    assert "_created" not in response.text  # no timestamp series beside each counter


def test_disconnect_mid_stream_frees_the_engine_blocks(gateway: Server):
    body = chat_body("Tell a story.", stream=True, max_tokens=2000, ignore_eos=True)
    headers = {"Authorization": f"Bearer {ALICE}", "Cache-Control": "no-store"}
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST", gateway.url + "/v1/chat/completions", json=body, headers=headers
        ) as r,
    ):
        lines = r.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert all(line.startswith("data: ") or not line for line in received)
        assert metric(gateway, "semgate_num_requests_running") == 1
        assert metric(gateway, "semgate_kv_cache_usage_perc") > 0
    # Leaving the `with` closes the connection mid-answer: the engine must let go at once.
    wait_for_idle_engine(gateway)
    assert metric(gateway, "semgate_num_requests_running") == 0
    assert metric(gateway, "semgate_kv_cache_usage_perc") == 0


def test_disconnect_before_a_json_answer_aborts_its_engine_request(gateway: Server):
    """A non-streamed answer sends nothing until it is complete: the server must still see
    the client leave (here: its read timeout) and abort, not generate 2000 tokens."""
    aborted = 'semgate_requests_total{cache_status="bypass",finish_reason="abort"}'
    before = metric(gateway, aborted, missing=0)
    body = chat_body("Tell a long story.", max_tokens=2000, ignore_eos=True)
    headers = {"Authorization": f"Bearer {ALICE}", "Cache-Control": "no-store"}
    with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=2) as client:
        client.post(gateway.url + "/v1/chat/completions", json=body, headers=headers)
    # The gateway counts the abort before it sends it to the engine, so an idle engine
    # means the abort is counted too.
    wait_for_idle_engine(gateway)
    assert metric(gateway, aborted, missing=0) == before + 1
    assert metric(gateway, "semgate_num_requests_running") == 0
    assert metric(gateway, "semgate_kv_cache_usage_perc") == 0


def test_admin_bodies_are_decoded_strictly(gateway: Server):
    """The admin API's bodies get the same treatment: not UTF-8 is a 400, a string where
    a number belongs a 400 naming it, and neither leaves a traceback in the log."""
    headers = {"Authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
    seed = b'{"question": "caf\xe9?", "answer": "yes"}'
    response = httpx.post(gateway.url + "/admin/cache/entries", content=seed, headers=headers)
    assert assert_error(response, 400)["message"] == "the body is not valid UTF-8"
    response = httpx.put(
        gateway.url + "/admin/cache/threshold", content=b'{"default": "0.9"}', headers=headers
    )
    assert assert_error(response, 400)["param"] == "default"
    assert "Traceback" not in gateway.log()


def test_openapi_describes_what_the_server_sends(gateway: Server):
    """The chat answer as JSON or SSE with its cache headers, and OpenAI's error object at
    every error status, never Litestar's `{status_code, detail, extra}`."""
    spec = httpx.get(gateway.url + "/schema/openapi.json").json()
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    ok = chat["responses"]["200"]
    assert ok["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert "text/event-stream" in ok["content"]
    answer_headers = {"X-Cache-Status", "X-Cache-Similarity", "Age", "X-Cache-Saved-Seconds"}
    assert answer_headers | {"Server-Timing"} <= set(ok["headers"])
    assert "`timings`" in ok["content"]["text/event-stream"]["schema"]["description"]
    assert "cache-control" in [p["name"] for p in chat["parameters"]]
    # The limits as msgspec checks them (bounds of 0 included), from the same declaration.
    limits = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert limits["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 2}
    assert limits["top_p"]["anyOf"][0] == {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    assert limits["max_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 1}
    assert limits["messages"]["minItems"] == 1
    admin = spec["components"]["schemas"]
    assert admin["ThresholdUpdate"]["additionalProperties"] is False
    assert admin["SeedEntry"]["properties"]["ttl"]["anyOf"][0]["maximum"] == 315360000
    similarity = admin["ThresholdUpdate"]["properties"]["default"]["anyOf"][0]
    assert (similarity["minimum"], similarity["maximum"]) == (0, 1)
    embeddings = spec["paths"]["/v1/embeddings"]["post"]["responses"]["200"]
    assert embeddings["content"]["application/json"]["schema"]["$ref"].endswith("/EmbeddingList")
    assert {"200", "503"} <= set(spec["paths"]["/ready"]["get"]["responses"])
    for status in ("400", "401", "404", "413", "429", "503"):
        schema = chat["responses"][status]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/ErrorResponse"), status
    for path, method, status, struct in (
        ("/admin/cache/lookup", "post", "200", "LookupView"),
        ("/admin/cache/entries", "get", "200", "EntryPage"),
        ("/admin/cache/entries", "post", "201", "EntryView"),
        ("/admin/cache", "delete", "200", "Flushed"),
    ):  # the admin API's answers are typed too
        response = spec["paths"][path][method]["responses"][status]
        assert response["content"]["application/json"]["schema"]["$ref"].endswith(f"/{struct}")
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema.get("$ref", "").endswith("/ErrorResponse"), (method, path)


def test_the_docs_page_works_offline(gateway: Server):
    """/schema renders Swagger UI from the gateway's own assets, never from a CDN."""
    page = httpx.get(gateway.url + "/schema/swagger")
    assert page.status_code == 200
    assert "https://" not in page.text and "/schema/assets/swagger-ui-bundle.js" in page.text
    script = httpx.get(gateway.url + "/schema/assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and len(script.content) > 100_000
