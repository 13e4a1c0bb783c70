"""The model router: `--upstream MODEL=URL[,URL...]` groups beside plain URLs, model
aliases, the in-process engine as one model among them (gateway/upstream/model_router.py,
gateway/upstream/specs.py): the settings, the model router alone, and gateways in front of
fake upstreams (tests/gateway/fake_upstream.py) driven with the OpenAI SDK."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from cli.main import build_parser
from cli.serve_command import _settings
from gateway.embeddings import BUNDLED_NAME as EMBEDDER
from gateway.errors import APIError
from gateway.model_rename import renamed_lines
from gateway.settings import Settings
from gateway.upstream import HttpUpstream, ModelRouter
from tests.gateway.conftest import ADMIN, settle
from tests.gateway.fake_upstream import ARGUMENTS, FakeUpstream
from tests.gateway.servers import MODEL, Server, caching_server, free_port, serving

LLAMA, QWEN, ALIAS = "llama-3-8b", "qwen-2-7b", "gpt-4o-mini"


def cli_settings(*argv: str) -> Settings:
    return _settings(build_parser().parse_args(["serve", *argv]))


# Settings.


def test_groups_plain_urls_and_aliases_from_flags():
    settings = cli_settings(
        "--upstream", f"{LLAMA}=http://a:8000,http://b:8000/",
        "--upstream", f"{QWEN}=http://c:8000",
        "--upstream", "http://d:8000,http://e:8000",
        "--upstream", f"{LLAMA}=http://f:8000",  # a model given twice gets both
        "--model-alias", f"{ALIAS}={LLAMA}",
        "--model-alias", f"qwen={QWEN}",
    )  # fmt: skip
    assert settings.upstream_groups == {
        LLAMA: ["http://a:8000", "http://b:8000", "http://f:8000"],
        QWEN: ["http://c:8000"],
    }
    assert settings.upstreams == ["http://d:8000", "http://e:8000"]
    assert settings.model_aliases == {ALIAS: LLAMA, "qwen": QWEN}
    assert not settings.runs_engine


def test_plain_urls_parse_as_before():
    settings = cli_settings("--upstream", "http://a:8000,https://b.example/v")
    assert settings.upstreams == ["http://a:8000", "https://b.example/v"]
    assert settings.upstream_groups == {}
    env = {"SEMGATE_UPSTREAMS": "http://a:8000,http://b:8000"}
    assert Settings.load(env=env).upstreams == ["http://a:8000", "http://b:8000"]


def test_the_in_process_engine_runs_without_upstreams_or_when_asked():
    assert cli_settings().runs_engine
    assert not cli_settings("--upstream", f"{LLAMA}=http://a:8000").runs_engine
    assert cli_settings("--upstream", f"{LLAMA}=http://a:8000", "--local-engine").runs_engine
    assert Settings.load(
        env={"SEMGATE_UPSTREAMS": "http://a", "SEMGATE_LOCAL_ENGINE": "1"}
    ).runs_engine


def test_groups_and_aliases_from_the_environment():
    env = {
        "SEMGATE_UPSTREAMS": f"{LLAMA}=http://a:8000,http://b:8000; {QWEN}=http://c:8000;http://d",
        "SEMGATE_MODEL_ALIASES": f"{ALIAS}={LLAMA}, qwen={QWEN}",
    }
    settings = Settings.load(env=env)
    assert settings.upstream_groups == {LLAMA: ["http://a:8000", "http://b:8000"],
                                        QWEN: ["http://c:8000"]}  # fmt: skip
    assert settings.upstreams == ["http://d"]
    assert settings.model_aliases == {ALIAS: LLAMA, "qwen": QWEN}


def test_groups_and_aliases_from_the_config_file(tmp_path: Path):
    path = tmp_path / "semgate.toml"
    path.write_text(
        f'[upstreams]\n"{LLAMA}" = ["http://a:8000", "http://b:8000"]\n"{QWEN}" = "http://c:8000"\n'
        f'[model_aliases]\n"{ALIAS}" = "{LLAMA}"\n'
    )
    settings = Settings.load(path, env={})
    assert settings.upstream_groups == {LLAMA: ["http://a:8000", "http://b:8000"],
                                        QWEN: ["http://c:8000"]}  # fmt: skip
    assert settings.upstreams == []
    assert settings.model_aliases == {ALIAS: LLAMA}
    # The environment's upstreams replace the file's, groups and all.
    replaced = Settings.load(path, env={"SEMGATE_UPSTREAMS": "http://d"})
    assert (replaced.upstreams, replaced.upstream_groups) == (["http://d"], {})
    path.write_text(f'upstreams = ["http://d", "{QWEN}=http://c:8000"]\n')
    listed = Settings.load(path, env={})
    assert (listed.upstreams, listed.upstream_groups) == (["http://d"], {QWEN: ["http://c:8000"]})


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--upstream", "localhost:8000"], "--upstream: 'localhost:8000' is not an http"),
        (["--upstream", f"http://a,{QWEN}=http://c"], "--upstream: .* is not an http"),
        (["--upstream", f"{LLAMA}="], "--upstream: no URL"),
        (["--upstream", "=http://a"], "--upstream: a group needs a model name"),
        (["--model-alias", ALIAS], "--model-alias must look like PUBLIC=MODEL"),
        (["--model-alias", f"a=b,b={LLAMA}"], "b is an alias itself"),
        (["--model-alias", "a=a"], "a is an alias itself"),
        (["--upstream", f"{LLAMA}=http://a", "--model-alias", f"{LLAMA}=x"], "upstream group"),
    ],
    ids=[
        "no-scheme",
        "group-in-a-url-list",
        "no-url",
        "no-model",
        "alias-no-equals",
        "alias-chain",
        "alias-of-itself",
        "alias-shadows-a-group",
    ],
)
def test_bad_routing_settings_are_refused_naming_the_flag(argv: list[str], error: str):
    with pytest.raises(ValueError, match=error):
        cli_settings(*argv)


def test_a_bad_config_file_upstream_names_the_file(tmp_path: Path):
    path = tmp_path / "semgate.toml"
    path.write_text("[upstreams]\nllama = 3\n")
    with pytest.raises(ValueError, match=r"semgate\.toml: upstreams: llama must be a URL"):
        Settings.load(path, env={})


# The router alone (its upstreams never started: nothing is asked over the network).


def router(*extra: HttpUpstream) -> ModelRouter:
    groups = [HttpUpstream(["http://a:8000", "http://b:8000"], model=LLAMA),
              HttpUpstream(["http://c:8000"], model=QWEN)]  # fmt: skip
    return ModelRouter([*groups, *extra], {ALIAS: LLAMA, "ghost": "nobody"})


def test_the_router_lists_models_then_aliases_with_their_owners():
    models = router()
    assert models.models() == [LLAMA, QWEN, ALIAS]  # "ghost" names no served model
    assert models.owner(ALIAS) == models.owner(LLAMA) == "a:8000,b:8000"
    assert models.owner(QWEN) == "c:8000"
    assert models.route(ALIAS) == LLAMA and models.route(LLAMA) == LLAMA


@pytest.mark.parametrize("model", ["nope", "ghost"])
def test_a_model_nobody_serves_is_404(model: str):
    with pytest.raises(APIError) as info:
        router().route(model)
    assert (info.value.status, info.value.code, info.value.param) == (
        404,
        "model_not_found",
        "model",
    )


def test_an_unknown_model_is_503_while_a_discovered_upstream_has_not_listed_its_models():
    models = router(HttpUpstream([f"http://127.0.0.1:{free_port()}"]))
    with pytest.raises(APIError) as info:
        models.route("nope")
    assert (info.value.status, info.value.code) == (503, "upstreams_starting")
    assert info.value.retry_after == 2
    assert models.route(ALIAS) == LLAMA  # the declared ones route meanwhile


def test_renamed_lines_rewrite_model_fields_across_chunk_boundaries():
    events = [
        {"model": LLAMA, "choices": [{"delta": {"content": '{"model": "x"}'}}]},
        {"model": LLAMA},
    ]
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    async def main() -> bytes:
        return b"".join([c async for c in renamed_lines(chunks(), ALIAS)])

    out = asyncio.run(main()).decode()
    lines = [json.loads(line[6:]) for line in out.split("\n\n") if line.startswith("data: {")]
    assert [e["model"] for e in lines] == [ALIAS, ALIAS]
    assert lines[0]["choices"][0]["delta"]["content"] == '{"model": "x"}'  # a string's own text
    assert out.endswith("data: [DONE]\n\n")


# Gateways in front of fake upstreams.


@pytest.fixture(scope="module")
def llama() -> Iterator[FakeUpstream]:
    with FakeUpstream(models=("served-elsewhere",)) as fake:  # a group's list is not asked
        yield fake


@pytest.fixture(scope="module")
def qwen() -> Iterator[FakeUpstream]:
    with FakeUpstream(models=(QWEN,)) as fake:
        yield fake


@pytest.fixture(scope="module")
def gateways(
    llama: FakeUpstream, qwen: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Server]]:
    """`front`: a cache-on gateway before both fakes, a model alias and a model list to
    discover; `mixed`: the in-process engine's model beside one upstream group, cache
    off. Started side by side, so that their loads overlap."""
    front = [
        "--upstream", f"{LLAMA}={llama.url}",
        "--upstream", qwen.url,  # its models discovered
        "--model-alias", f"{ALIAS}={LLAMA}",
        "--admin-key", ADMIN,
    ]  # fmt: skip
    mixed = [
        "--upstream", f"{QWEN}={qwen.url}", "--local-engine", "--model-alias", f"small={MODEL}",
        "--no-cache", "--num-threads", "1", "--max-model-len", "512",
    ]  # fmt: skip
    with serving(caching_server(tmp_path_factory, front), Server(mixed)) as servers:
        yield servers


@pytest.fixture(scope="module")
def front(gateways: list[Server]) -> Server:
    return gateways[0]


@pytest.fixture(scope="module")
def mixed(gateways: list[Server]) -> Server:
    return gateways[1]


@pytest.fixture(scope="module")
def client(front: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, model: str, question: str, **kw: Any) -> tuple[Any, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": question}], temperature=0, **kw
    )
    return raw.parse(), raw.headers["x-cache-status"]


slow = pytest.mark.slow  # the tests below start gateways of their own


@slow
def test_models_lists_every_served_model_and_alias_with_its_owner(
    client: openai.OpenAI, llama: FakeUpstream, qwen: FakeUpstream
):
    cards = {m.id: m.owned_by for m in client.models.list()}
    assert cards == {LLAMA: f"127.0.0.1:{llama.port}", QWEN: f"127.0.0.1:{qwen.port}",
                     ALIAS: f"127.0.0.1:{llama.port}", EMBEDDER: "semgate"}  # fmt: skip
    # Groups first (the first: the default), the embedder that /v1/embeddings serves last.
    assert list(cards) == [LLAMA, QWEN, ALIAS, EMBEDDER]
    assert client.models.retrieve(ALIAS).owned_by == f"127.0.0.1:{llama.port}"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


@slow
def test_each_model_goes_to_its_own_upstream(
    client: openai.OpenAI, front: Server, llama: FakeUpstream, qwen: FakeUpstream
):
    before = len(llama.bodies), len(qwen.bodies)
    answer, status = ask(client, LLAMA, f"Where is Lima? {uuid.uuid4()}")
    assert (status, answer.model) == ("Miss", LLAMA)
    assert [b["model"] for b in llama.bodies[before[0] :]] == [LLAMA]
    answer, _ = ask(client, QWEN, f"Where is Quito? {uuid.uuid4()}")
    assert answer.model == QWEN
    assert [b["model"] for b in qwen.bodies[before[1] :]] == [QWEN]
    assert len(llama.bodies) == before[0] + 1


@slow
def test_an_alias_is_sent_as_its_target_and_answered_under_its_own_name(
    client: openai.OpenAI, front: Server, llama: FakeUpstream
):
    question = f"What is the capital of Peru? {uuid.uuid4()}"
    answer, status = ask(client, ALIAS, question)
    assert (status, answer.model) == ("Miss", ALIAS)
    assert llama.bodies[-1]["model"] == LLAMA
    settle(front.url)
    # One partition for the model, whichever of its names asked: the target's.
    answer, status = ask(client, LLAMA, question)
    assert (status, answer.model) == ("Hit", LLAMA)
    stream = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": question}], temperature=0, stream=True
    )
    assert {chunk.model for chunk in stream} == {ALIAS}


@slow
def test_models_keep_separate_cache_partitions(client: openai.OpenAI, front: Server):
    question = f"What is the capital of Chile? {uuid.uuid4()}"
    assert ask(client, LLAMA, question)[1] == "Miss"
    settle(front.url)
    assert ask(client, QWEN, question)[1] == "Miss"  # not llama's answer
    settle(front.url)
    assert ask(client, QWEN, question)[1] == "Hit"


@slow
def test_the_admin_api_names_a_model_by_its_served_name(front: Server):
    headers = {"Authorization": f"Bearer {ADMIN}"}
    url = front.url + "/admin/cache/threshold"
    put = httpx.put(url, json={"per_model": {ALIAS: 0.9}}, headers=headers)
    try:
        assert put.json()["per_model"] == {LLAMA: 0.9}  # the alias's partition is its target's
    finally:
        httpx.put(url, json={"per_model": {}}, headers=headers).raise_for_status()
    unknown = httpx.put(url, json={"per_model": {"nope": 0.9}}, headers=headers)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "per_model.nope"


TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}
]


@slow
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_alias_passes_through_as_its_target(
    client: openai.OpenAI, llama: FakeUpstream, stream: bool
):
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "6 times 7?"}]
    # A ChatCompletion, or a Stream of chunks with `stream`: which one, the test's parameter says.
    created: Any = client.chat.completions.create(
        model=ALIAS,
        messages=messages,
        tools=TOOLS,
        stream=stream,
    )
    assert llama.bodies[-1]["model"] == LLAMA and llama.bodies[-1]["tools"] == TOOLS
    if stream:
        chunks = list(created)
        assert {c.model for c in chunks} == {ALIAS}
        pieces = [c.choices[0].delta.tool_calls for c in chunks if c.choices]
        arguments = "".join(t[0].function.arguments or "" for t in pieces if t)
    else:
        assert created.model == ALIAS
        arguments = created.choices[0].message.tool_calls[0].function.arguments
    assert arguments == ARGUMENTS  # the rest as the upstream sent it


@slow
@pytest.mark.parametrize("tools", [None, TOOLS], ids=["cached-path", "pass-through"])
def test_a_model_nobody_serves_is_404_and_reaches_no_upstream(
    front: Server, llama: FakeUpstream, qwen: FakeUpstream, tools: list[Any] | None
):
    before = len(llama.bodies) + len(qwen.bodies)
    body: dict[str, Any] = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    if tools:
        body["tools"] = tools
    response = httpx.post(front.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert len(llama.bodies) + len(qwen.bodies) == before


@slow
def test_the_in_process_engine_serves_its_model_beside_the_upstreams(
    mixed: Server, qwen: FakeUpstream
):
    client = openai.OpenAI(base_url=mixed.url + "/v1", api_key="unused", max_retries=0)
    cards = {m.id: m.owned_by for m in client.models.list()}
    assert cards == {MODEL: "semgate", QWEN: f"127.0.0.1:{qwen.port}", "small": "semgate",
                     EMBEDDER: "semgate"}  # fmt: skip
    before = len(qwen.bodies)
    local = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
    )
    assert local.model == "small" and local.choices[0].message.content
    assert len(qwen.bodies) == before  # answered here
    remote, _ = ask(client, QWEN, "Where is Quito?")
    assert remote.model == QWEN and qwen.bodies[-1]["model"] == QWEN
    # What the cache cannot key passes through to the upstreams only: the in-process
    # engine refuses it, naming the field.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    refused = httpx.post(mixed.url + "/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
    passed = httpx.post(
        mixed.url + "/v1/chat/completions", json={**body, "model": QWEN}, timeout=30
    )
    assert passed.headers["x-cache-bypass-reason"] == "tools"
    assert len(qwen.bodies) == before + 2
