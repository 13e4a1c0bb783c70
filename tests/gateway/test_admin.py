"""The admin API: keys, thresholds, stats, entries and dry-run lookups, over HTTP."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway.conftest import ALICE, messages, seed, settle
from tests.gateway.servers import MODEL, Server

pytestmark = pytest.mark.usefixtures("fresh")


@pytest.fixture
def restore_threshold(admin: httpx.Client) -> Iterator[None]:
    before = admin.get("/admin/cache/threshold").json()
    yield
    admin.put("/admin/cache/threshold", json=before).raise_for_status()


def status_of(client: openai.OpenAI, question: str) -> str:
    """The cache status of `question`'s answer, once that answer is stored (a miss's
    store ends just after its response: asking again at once would race it)."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages(question), temperature=0, max_tokens=96
    )
    settle(client.base_url)
    return raw.headers["x-cache-status"]


@pytest.mark.parametrize(
    ("key", "status"), [(None, 401), ("sk-wrong", 401), (ALICE, 403)], ids=["none", "wrong", "chat"]
)
def test_admin_refuses_without_the_admin_key(gateway: Server, key: str | None, status: int):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for method, path in (("GET", "/admin/cache/stats"), ("DELETE", "/admin/cache")):
        response = httpx.request(method, gateway.url + path, headers=headers)
        assert response.status_code == status
        assert response.json()["error"]["type"] in ("authentication_error", "permission_error")


def test_threshold_changes_take_effect_on_the_next_request(
    admin: httpx.Client, alice: openai.OpenAI, restore_threshold: None
):
    assert status_of(alice, "How many legs does a spider have?") == "Miss"
    assert status_of(alice, "How many legs do spiders have?") == "Hit"
    strict = admin.put("/admin/cache/threshold", json={"default": 0.995})
    assert strict.status_code == 200 and strict.json()["default"] == 0.995
    assert status_of(alice, "Spiders have how many legs?") == "Miss"
    per_tenant = admin.put("/admin/cache/threshold", json={"per_tenant": {"alice": 0.8}})
    assert per_tenant.json() == {"default": 0.995, "per_model": {}, "per_tenant": {"alice": 0.8}}
    assert status_of(alice, "How many legs do spiders have?") == "Hit"


@pytest.mark.parametrize(
    "body", [{"default": 1.5}, {"default": -0.1}, {"per_model": {MODEL: 2}}, {"default": "high"}]
)
def test_threshold_is_validated(admin: httpx.Client, body: dict[str, object]):
    before = admin.get("/admin/cache/threshold").json()
    response = admin.put("/admin/cache/threshold", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["message"]
    assert admin.get("/admin/cache/threshold").json() == before  # nothing half-applied


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        ("put", "/admin/cache/threshold", {"defualt": 0.9}, 400, "defualt"),
        ("put", "/admin/cache/threshold", {"per_tenant": {"alice": 1.5}}, 400, "per_tenant"),
        ("put", "/admin/cache/threshold", {"per_model": {"gpt-9": 0.9}}, 404, "per_model.gpt-9"),
        ("post", "/admin/cache/lookup", {"question": "Hi?", "threshold": 5}, 400, "threshold"),
        ("post", "/admin/cache/lookup", {"question": "Hi?", "model": "gpt-9"}, 404, "model"),
        ("post", "/admin/cache/lookup",
         {"question": "Hi?", "messages": [{"role": "user", "content": "Hi?"}]}, 400, "question"),
        ("post", "/admin/cache/entries", {"question": "Q?", "answer": "A.", "model": "gpt-9"},
         404, "model"),
        ("post", "/admin/cache/entries", {"question": "Q?", "answer": "A.", "ttl_s": 5}, 400,
         "ttl_s"),
    ],
    ids=["misspelt-field", "tenant-range", "unserved-model-threshold", "lookup-range",
         "lookup-unserved-model", "question-and-messages", "seed-unserved-model", "seed-ttl-s"],
)  # fmt: skip
def test_admin_bodies_are_validated(
    admin: httpx.Client, method: str, path: str, body: dict, status: int, param: str | None
):
    """Every mistake is an error naming its field, and changes nothing: a misspelt field
    used to answer 200 and keep the old value, and a model nobody serves was accepted."""
    thresholds = admin.get("/admin/cache/threshold").json()
    entries = admin.get("/admin/cache/entries").json()["total"]
    response = admin.request(method, path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param, error
    if status == 404:
        assert error["code"] == "model_not_found"
    assert admin.get("/admin/cache/threshold").json() == thresholds
    assert admin.get("/admin/cache/entries").json()["total"] == entries


def test_seed_list_get_delete_and_flush(admin: httpx.Client, alice: openai.OpenAI):
    answer = "About 299,792 km per second."
    entry = seed(admin, "What is the speed of light?", answer, "alice", ttl=600)
    raw = alice.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages("How fast does light travel?"), temperature=0
    )
    assert raw.headers["x-cache-status"] == "Hit"
    assert raw.headers["x-cache-entry"] == entry["id"]
    assert raw.parse().choices[0].message.content == answer

    listing = admin.get("/admin/cache/entries", params={"tenant": "alice", "q": "light"}).json()
    assert listing["total"] == 1 and listing["data"][0]["id"] == entry["id"]
    assert admin.get("/admin/cache/entries", params={"tenant": "bob"}).json()["total"] == 0
    got = admin.get(f"/admin/cache/entries/{entry['id']}").json()
    assert got["hits"] >= 1 and 0 < got["ttl"] <= 600

    assert admin.delete(f"/admin/cache/entries/{entry['id']}").status_code == 204
    missing = admin.delete(f"/admin/cache/entries/{entry['id']}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

    for question in ("One?", "Two?"):
        body = {"question": question, "answer": "x", "tenant": "bob"}
        admin.post("/admin/cache/entries", json=body).raise_for_status()
    assert admin.delete("/admin/cache", params={"tenant": "bob"}).json() == {"deleted": 2}


def test_flushing_everything_must_be_said(admin: httpx.Client):
    """`DELETE /admin/cache/entries/..` (an entry id gone wrong) is sent as
    `DELETE /admin/cache` by httpx and curl: with no filter, nothing is flushed."""
    body = {"question": f"Kept? {uuid.uuid4().hex[:8]}", "answer": "Yes.", "tenant": "carol"}
    admin.post("/admin/cache/entries", json=body).raise_for_status()
    refused = admin.delete("/admin/cache/entries/..")
    assert refused.request.url.path == "/admin/cache"
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "missing_scope"
    filtered = admin.delete("/admin/cache", params={"all": "true", "tenant": "dave"})
    assert filtered.json() == {"deleted": 0}  # a filter given: all=true adds nothing
    assert admin.get("/admin/cache/entries", params={"tenant": "carol"}).json()["total"] == 1
    assert admin.delete("/admin/cache", params={"all": "true"}).json()["deleted"] >= 1
    assert admin.get("/admin/cache/entries", params={"tenant": "carol"}).json()["total"] == 0


@pytest.mark.parametrize(
    "params",
    [{"tenant": ""}, {"model": ""}, {"tenant": "", "model": ""}, {"all": "false", "tenant": ""}],
    ids=["tenant", "model", "both", "all-false"],
)
def test_an_empty_filter_is_no_filter(admin: httpx.Client, params: dict[str, str]):
    """`DELETE /admin/cache?tenant=` (a script's unset variable) flushed every tenant's
    entries with a 200: an empty value names nothing, so no scope is given."""
    for tenant in ("alice", "bob"):
        seed(admin, f"Kept for {tenant}?", "Yes.", tenant)
    refused = admin.delete("/admin/cache", params=params)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "missing_scope"
    for tenant in ("alice", "bob"):
        assert admin.get("/admin/cache/entries", params={"tenant": tenant}).json()["total"] == 1


def test_an_empty_filter_beside_another_leaves_that_one_alone(admin: httpx.Client):
    for tenant in ("alice", "bob"):
        seed(admin, f"Kept for {tenant}?", "Yes.", tenant)
    flushed = admin.delete("/admin/cache", params={"tenant": "bob", "model": ""})
    assert flushed.json() == {"deleted": 1}
    assert admin.get("/admin/cache/entries", params={"tenant": "alice"}).json()["total"] == 1
    listed = admin.get("/admin/cache/entries", params={"tenant": "", "model": MODEL, "q": ""})
    assert listed.status_code == 200 and listed.json()["total"] >= 1


def test_search_words_that_name_no_word_are_400(admin: httpx.Client):
    """`q=?!` has no word to search: it listed every entry as if no `q` were given."""
    response = admin.get("/admin/cache/entries", params={"q": "?!"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "q"


def test_seed_rejects_empty_answers(admin: httpx.Client):
    response = admin.post("/admin/cache/entries", json={"question": "Q?", "answer": " "})
    assert response.status_code == 400


def test_dry_run_lookup_explains_the_verdict(admin: httpx.Client, alice: openai.OpenAI):
    assert status_of(alice, "Who wrote Pride and Prejudice?") == "Miss"
    stats_before = admin.get("/admin/cache/stats").json()

    def lookup(question: str) -> dict[str, object]:
        body = {"messages": messages(question), "tenant": "alice"}
        response = admin.post("/admin/cache/lookup", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    near = lookup("When was Pride and Prejudice written?")
    assert near["would_hit"] is False
    best = near["candidates"][0]
    assert best["above_threshold"] is True
    assert best["guard"]["ok"] is False and best["guard"]["rule"] == "question_type"
    para = lookup("Who is the author of Pride and Prejudice?")
    assert para["would_hit"] is True and para["hit"]["similarity"] >= para["threshold"]
    assert admin.get("/admin/cache/stats").json()["lookups"] == stats_before["lookups"]


def test_stats_count_hits_and_misses(admin: httpx.Client, alice: openai.OpenAI):
    before = admin.get("/admin/cache/stats").json()
    status_of(alice, "What is the boiling point of water at sea level?")
    status_of(alice, "At sea level, what temperature does water boil at?")
    after = admin.get("/admin/cache/stats").json()
    assert after["lookups"] - before["lookups"] == 2
    assert after["misses"] - before["misses"] == 1
    semantic = [stats["hits_by_tier"].get("semantic-english", 0) for stats in (before, after)]
    assert semantic[1] - semantic[0] == 1
    assert sum(after["best_similarity_histogram"]["counts"]) > 0


def test_stats_say_per_language_which_tier_serves_it(admin: httpx.Client, alice: openai.OpenAI):
    status_of(alice, "Quelle est la capitale de l'Australie ?")
    status_of(alice, "Hur många invånare har Stockholm?")  # Swedish: nothing fitted
    stats = admin.get("/admin/cache/stats").json()
    languages = stats["languages"]
    assert languages["en"]["tier"] == "semantic-english"
    assert languages["fr"]["tier"] == "semantic-multilingual"
    assert 0 < languages["fr"]["threshold"] < 1 and languages["fr"]["lookups"] >= 1
    assert languages["sv"]["tier"] == "exact only" and languages["sv"]["lookups"] >= 1
    assert "fr" in stats["tiers"]["semantic-multilingual"]["languages"]


def test_entry_search_text_cannot_widen_the_filter(admin: httpx.Client):
    body = {"question": "Where is the lighthouse?", "answer": "On the cliff.", "tenant": "bob"}
    admin.post("/admin/cache/entries", json=body).raise_for_status()
    sneaky = {"tenant": "alice", "q": "lighthouse)|(@tenant:{bob}"}
    response = admin.get("/admin/cache/entries", params=sneaky)
    assert response.status_code == 200 and response.json()["total"] == 0
    found = admin.get("/admin/cache/entries", params={"tenant": "bob", "q": "lighthouse?"})
    assert found.json()["total"] == 1


@pytest.mark.parametrize(
    ("method", "path", "params", "param"),
    [
        ("GET", "/admin/cache/entries", {"offset": 1_000_001}, "offset"),
        ("GET", "/admin/cache/entries", {"offset": 2**31}, "offset"),
        ("GET", "/admin/cache/entries", {"tenant": "a\x00b"}, "tenant"),
        ("GET", "/admin/cache/entries", {"model": "a\x00b"}, "model"),
        ("DELETE", "/admin/cache", {"tenant": "a\x00b"}, "tenant"),
        ("DELETE", "/admin/cache", {"model": "\x00"}, "model"),
    ],
    ids=[
        "offset-past-max",
        "offset-2^31",
        "nul-tenant",
        "nul-model",
        "flush-nul-tenant",
        "flush-nul-model",
    ],
)
def test_parameters_out_of_range_or_ill_formed_are_400(
    admin: httpx.Client, method: str, path: str, params: dict[str, object], param: str
):
    """RediSearch's own limits (an offset past 1,000,000) and a NUL, which ends the query
    Redis parses, were 500s."""
    response = admin.request(method, path, params=params)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert admin.get("/admin/cache/entries", params={"offset": 1_000_000}).status_code == 200


@pytest.mark.parametrize(
    ("path", "tenant"),
    [
        ("/admin/cache/entries", "a\x00b"),
        ("/admin/cache/lookup", "\t"),
        # An entry seeded for tenant "" could be named by no filter: only all=true would
        # reach it.
        ("/admin/cache/entries", ""),
        ("/admin/cache/lookup", ""),
    ],
    ids=["seed-nul", "lookup-tab", "seed-empty", "lookup-empty"],
)
def test_control_characters_or_nothing_in_a_body_tenant_are_400(
    admin: httpx.Client, path: str, tenant: str
):
    seeding = {"answer": "A."} if path.endswith("entries") else {}
    response = admin.post(path, json={"question": "Q?", "tenant": tenant, **seeding})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tenant"


def test_seeds_are_bounded_by_the_context_length(admin: httpx.Client):
    """A 3 MB answer (73 times the context length) was accepted, and then served as a hit
    with that usage; a seed must fit the model's context, as a generated answer does."""
    huge = admin.post("/admin/cache/entries", json={"question": "Q?", "answer": "a " * 1_500_000})
    assert huge.status_code == 400
    assert huge.json()["error"]["code"] == "context_length_exceeded"
    # Too long once counted, though short enough for the bound by length alone.
    words = admin.post("/admin/cache/entries", json={"question": "Q?", "answer": "word " * 9000})
    assert words.status_code == 400
    assert "do not fit" in words.json()["error"]["message"]
    assert admin.get("/admin/cache/entries", params={"q": "word"}).json()["total"] == 0
