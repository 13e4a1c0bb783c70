"""Answers whose request sets no max_tokens end by the server's default cap
(`--default-max-tokens`): the README's own question looped "la France, la France, ..."
to the context's end (862 s) with none. The in-process engine stops at the cap, a remote
server's stream is cut there, a hit and a miss agree on it, and a client's own max_tokens
still rules up to the context."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway.conftest import DEFAULT_CAP, SMALL_CONTEXT, client_of, messages, seed, settle
from tests.gateway.fake_upstream import MODEL as FAKE_MODEL
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.fixtures import ADMIN, ALICE
from tests.gateway.servers import MODEL, Server, serving

pytestmark = pytest.mark.slow  # a server of its own

CAP, CONTEXT = DEFAULT_CAP, SMALL_CONTEXT  # the bounded gateway's
RUN_ON = {"ignore_eos": True}  # the model does not stop by itself: only a limit ends it


@pytest.fixture(scope="module")
def servers(bounded_gateway: Server, fake: FakeUpstream) -> Iterator[tuple[Server, Server]]:
    """The session's bounded gateway (cache on, a small default cap and context), and a
    gateway of its own in front of the fake upstream that cuts at two deltas."""
    front = Server(["--upstream", fake.url, "--no-cache", "--default-max-tokens", "2"])
    with serving(front):
        yield bounded_gateway, front


@pytest.fixture(scope="module")
def client(servers: tuple[Server, Server]) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers[0].url + "/v1", api_key=ALICE, max_retries=0)


@pytest.fixture
def admin(servers: tuple[Server, Server]) -> Iterator[httpx.Client]:
    with client_of(servers[0], ADMIN) as admin:
        admin.delete("/admin/cache", params={"tenant": "alice"}).raise_for_status()
        yield admin


def test_an_answer_without_max_tokens_ends_at_the_cap(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model=MODEL, messages=messages("What is the capital of France?"), extra_body=RUN_ON
    )
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == CAP


def test_a_clients_max_tokens_rules_past_the_cap(client: openai.OpenAI):
    answer = client.chat.completions.create(
        model=MODEL, messages=messages("Count to fifty."), max_tokens=CAP + 8, extra_body=RUN_ON
    )
    assert answer.usage is not None and answer.usage.completion_tokens == CAP + 8


def test_the_cap_yields_to_a_shorter_room(client: openai.OpenAI):
    """A prompt that leaves less room than the cap gets the room, not a 400: the client
    asked no max_tokens that could not fit."""

    def ask(words: int, **kw: object) -> openai.types.chat.ChatCompletion:
        question = "Repeat: " + "word " * words
        return client.chat.completions.create(model=MODEL, messages=messages(question), **kw)

    probe = ask(150, max_tokens=1)
    assert probe.usage is not None
    words = 150 + CONTEXT - probe.usage.prompt_tokens - CAP // 2
    answer = ask(words, extra_body=RUN_ON)
    assert answer.usage is not None and answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens + answer.usage.completion_tokens == CONTEXT
    assert answer.usage.completion_tokens < CAP


def test_a_text_completion_without_max_tokens_ends_at_the_lower_default(client: openai.OpenAI):
    """OpenAI's default for text completions is 16; a lower cap wins."""
    answer = client.completions.create(model=MODEL, prompt="Once upon a time", extra_body=RUN_ON)
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == CAP


def test_a_cached_answer_past_the_cap_serves_only_a_request_that_allows_it(
    client: openai.OpenAI, admin: httpx.Client
):
    """The engine would cut an answer without max_tokens at the cap, so the cache must
    not serve it a longer one: a hit and a miss agree."""
    long_answer = "The Eiffel Tower is in Paris, on the Champ de Mars, beside the Seine river."
    seed(admin, "Where is the Eiffel Tower?", long_answer, "alice")
    question = messages("Where is the Eiffel Tower located?")
    capped = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=question, temperature=0
    )
    assert capped.headers["x-cache-status"] == "Miss"
    settle(client.base_url)
    allowed = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=question, temperature=0, max_tokens=64
    )
    assert allowed.headers["x-cache-status"] == "Hit"
    assert allowed.parse().choices[0].message.content == long_answer


def test_models_state_the_context_length(client: openai.OpenAI):
    assert client.models.retrieve(MODEL).model_extra == {"max_model_len": CONTEXT}
    listed = {m.id: m.model_extra for m in client.models.list().data}
    assert listed[MODEL] == {"max_model_len": CONTEXT}


def test_a_remote_answer_is_cut_at_the_cap(servers: tuple[Server, Server], fake: FakeUpstream):
    """A remote server is not sent the cap (its context is not known here: a prompt near
    it would be refused), and its stream is cut there instead."""
    front = openai.OpenAI(base_url=servers[1].url + "/v1", api_key="unused", max_retries=0)
    received = len(fake.bodies)
    answer = front.chat.completions.create(model=FAKE_MODEL, messages=messages("Hello?"))
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.content == "Answer 0 "
    assert "max_tokens" not in fake.bodies[received]
    asked = front.chat.completions.create(model=FAKE_MODEL, messages=messages("Hi?"), max_tokens=3)
    assert asked.choices[0].finish_reason == "stop" and fake.bodies[-1]["max_tokens"] == 3
