"""The cache against the real embedded Redis Stack and the real embedder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import pytest

from cache import CompletionOutcome, EmbeddedRedis, Embedder, LookupResult, SemanticCache
from cache.store import CacheStore
from tests.cache.fixtures import Run, ask
from tests.cache.test_components import long_texts
from tests.waiting import until

DONE = CompletionOutcome("Paris is the capital of France.", "stop")


def test_exact_then_semantic_then_guarded_near_miss(cache: SemanticCache, tenant: str, run: Run):
    q = "What is the capital of France?"
    assert run(cache.lookup(ask(q, tenant))).status == "miss"
    assert run(cache.store_answer(ask(q, tenant), DONE)) is not None

    exact = run(cache.lookup(ask("  what is the capital of france ", tenant)))
    assert exact.status == "hit" and exact.hit is not None and exact.hit.tier == "exact"

    para = run(cache.lookup(ask("Tell me the capital city of France", tenant)))
    assert para.status == "hit" and para.hit is not None and para.hit.tier == "semantic-english"
    assert para.hit.entry.response == DONE.text
    assert 0.7 <= para.hit.similarity < 1.0

    run(cache.seed("Convert 100 °F to Celsius", "37.8 °C", model="m", tenant=tenant))
    near = run(cache.lookup(ask("Convert 100 °C to Fahrenheit", tenant)))
    assert near.status == "miss"
    best = near.best
    assert best is not None and best.rejected
    assert cache.stats.guard_rejections == 1
    assert cache.stats.hits_by_tier == {"exact": 1, "semantic-english": 1}


def test_entries_the_caller_cannot_serve_are_passed_over(
    cache: SemanticCache, tenant: str, run: Run
):
    first = CompletionOutcome("Paris.", "stop")
    second = CompletionOutcome("The capital of France is Paris.", "stop")
    run(cache.store_answer(ask("What is the capital of France?", tenant), first))
    # Wordings whose content words are the same, so the verifier's verdict is not close.
    run(cache.store_answer(ask("What's the capital of France?", tenant), second))
    query = ask("Tell me the capital of France", tenant)

    longer_one = run(cache.lookup(query, accept=lambda entry: entry.response != "Paris."))
    assert longer_one.hit is not None and longer_one.hit.entry.response == second.text
    refused = run(cache.lookup(query, accept=lambda entry: False))
    assert refused.status == "miss" and refused.hit is None
    exact_refused = run(cache.lookup(ask("What is the capital of France?", tenant),
                                     accept=lambda entry: entry.response != "Paris."))  # fmt: skip
    assert exact_refused.hit is not None and exact_refused.hit.tier == "semantic-english"
    assert cache.stats.hits == 2 and cache.stats.misses == 1  # refused entries never count


def test_dry_run_reports_candidate_and_verdict_without_counting(
    cache: SemanticCache, tenant: str, run: Run
):
    run(cache.seed("Can I get a refund within 30 days?", "Yes.", model="m", tenant=tenant))
    dry = run(cache.lookup(ask("Can I get a refund after 30 days?", tenant), dry_run=True))
    assert dry.best is not None
    assert dry.best.verdict.rule == "polarity" and "after" in dry.best.verdict.detail
    assert dry.status == "miss"
    assert cache.stats.lookups == 0 and cache.stats.guard_rejections == 0


def test_ttl_expiry(cache: SemanticCache, tenant: str, run: Run):
    run(cache.store_answer(ask("How tall is Mount Everest?", tenant), DONE, ttl=1))
    assert run(cache.lookup(ask("How tall is Mount Everest?", tenant))).status == "hit"
    # Redis expires the entry a second after it was stored.
    until(
        "the entry expires",
        lambda: run(cache.lookup(ask("How tall is Mount Everest?", tenant))).status == "miss",
    )


def test_tenants_differing_only_in_case_are_apart(cache: SemanticCache, tenant: str, run: Run):
    q = "How do I rotate my API keys?"
    run(cache.store_answer(ask(q, tenant), DONE))
    assert run(cache.lookup(ask(q + " please", tenant))).status == "hit"
    assert run(cache.lookup(ask(q + " please", tenant.upper()))).status == "miss"
    assert run(cache.lookup(ask(q, tenant.upper()))).status == "miss"


def test_scopes_are_isolated(cache: SemanticCache, tenant: str, run: Run):
    q = "How do I reset my password?"
    run(cache.store_answer(ask(q, tenant, model="model-x"), DONE))
    assert run(cache.lookup(ask(q, tenant, model="model-x"))).status == "hit"
    assert run(cache.lookup(ask(q, tenant + "-other", model="model-x"))).status == "miss"
    assert run(cache.lookup(ask(q, tenant, model="model-y"))).status == "miss"
    # The same question after other turns belongs to another conversation context.
    before = [{"role": "system", "content": "You are a pirate."}]
    assert run(cache.lookup(ask(q, tenant, model="model-x", before=before))).status == "miss"


def test_search_reads_either_protocol(
    cache: SemanticCache, store: CacheStore, tenant: str, run: Run
):
    """The store reads FT.SEARCH replies itself: RESP3 (the default) and RESP2 clients
    find the same candidates."""
    run(cache.store_answer(ask("How do I reset my password?", tenant), DONE))
    resp2 = CacheStore(
        store.url + "?protocol=2", store.embedder_id, cache.embedder.dims, store.index.name
    )
    try:
        scope = cache.policy.scope(ask("", tenant))
        vector = run(cache.embedder.embed("How can I reset my password?"))
        found = run(store.search(scope, vector, 3))
        assert found and found[0].entry.response == DONE.text and found[0].tier == "semantic"
        assert run(resp2.search(scope, vector, 3)) == found
    finally:
        run(resp2.close())


def test_index_recreated_after_flushall(
    cache: SemanticCache, store: CacheStore, tenant: str, run: Run
):
    run(cache.seed("What is the boiling point of water?", "100 °C", model="m", tenant=tenant))
    run(store.client.flushall())
    assert run(cache.lookup(ask("What's water's boiling point?", tenant))).status == "miss"
    assert not cache.stats.errors
    run(cache.seed("What is the boiling point of water?", "100 °C", model="m", tenant=tenant))
    until(
        "the recreated index serves the entry",
        lambda: run(cache.lookup(ask("What's water's boiling point?", tenant))).status == "hit",
    )


def test_list_delete_and_flush_by_scope(
    cache: SemanticCache, store: CacheStore, tenant: str, run: Run
):
    a = run(cache.seed("How do I cancel my subscription?", "Settings.", model="x", tenant=tenant))
    run(cache.seed("Where is my order?", "Tracking page.", model="y", tenant=tenant))
    total, entries = run(store.list(tenant=tenant))
    assert total == 2 and {e.model for e in entries} == {"x", "y"}
    assert all(e.ttl is not None and e.ttl > 0 for e in entries)
    assert run(store.list(tenant=tenant, text="subscription"))[0] == 1
    assert run(store.delete(a.id)) and run(store.get(a.id)) is None
    assert run(store.flush(tenant=tenant, model="y")) == 1
    assert run(store.list(tenant=tenant))[0] == 0


def test_an_empty_scope_flushes_nothing(
    cache: SemanticCache, store: CacheStore, tenant: str, run: Run
):
    """An empty tenant or model names no entries: it must not flush every one."""
    run(cache.seed("Who keeps this?", "The flush.", model="x", tenant=tenant))
    for scope in ({"tenant": ""}, {"model": ""}, {"tenant": "", "model": "x"}):
        with pytest.raises(ValueError, match="names no entries"):
            run(store.flush(**scope))
    assert run(store.list(tenant=tenant))[0] == 1


def test_fail_open_when_redis_stops(embedder: Embedder, tmp_path: Path, run: Run):
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    store = CacheStore(server.url, embedder.model_id, embedder.dims, socket_timeout=0.5)
    cache = SemanticCache(store, embedder, timeout=1.0)
    run(store.connect())
    try:
        run(cache.store_answer(ask("What is 2 plus 2?", "t"), DONE))
        assert run(cache.lookup(ask("What is 2 plus 2?", "t"))).status == "hit"
        server.stop()
        result = run(cache.lookup(ask("What is 2 plus 2?", "t")))
        assert result.status == "error" and result.hit is None
        assert run(cache.store_answer(ask("What is 3 plus 3?", "t"), DONE)) is None
        assert cache.stats.errors["redis"] == 1 and cache.stats.errors["store_redis"] == 1
    finally:
        run(store.close())
        server.stop()


async def _coalesced(
    cache: SemanticCache, lookup: LookupResult, upstream: Callable[[], AsyncGenerator[str, None]]
) -> tuple[bool, AsyncGenerator[str, None]]:
    """Whether the request leads, and its answer: the flight it joined, or `upstream`'s."""
    seat = await cache.coalescer.join(lookup)
    return (True, seat.feed(upstream())) if seat.feeds else (False, seat.answer())


def test_coalescer_joins_20_equivalent_misses_to_one_flight(
    cache: SemanticCache, tenant: str, run: Run
):
    calls = 0
    questions = ["How do I export my contacts to CSV?"] * 12 + [
        "how do i export my contacts to csv",
        "How can I export my contacts to a CSV file?",
    ] * 4

    async def upstream():
        nonlocal calls
        calls += 1
        for piece in ["Open ", "Settings, ", "then ", "Export."]:
            await asyncio.sleep(0.05)
            yield piece

    async def one(question: str) -> tuple[bool, str]:
        lookup = await cache.lookup(ask(question, tenant))
        assert lookup.status == "miss"
        leader, stream = await _coalesced(cache, lookup, upstream)
        return leader, "".join([piece async for piece in stream])

    async def all_at_once():
        return await asyncio.gather(*(one(q) for q in questions))

    results = run(all_at_once())
    assert len(results) == 20 and calls == 1
    assert sum(leader for leader, _ in results) == 1
    assert {text for _, text in results} == {"Open Settings, then Export."}
    assert cache.stats.coalesced == 19 and cache.coalescer.in_flight() == 0


def test_coalescer_keeps_near_misses_apart(cache: SemanticCache, tenant: str, run: Run):
    calls = 0

    async def upstream():
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.1)
        yield "answer"

    async def one(question: str) -> None:
        lookup = await cache.lookup(ask(question, tenant))
        _, stream = await _coalesced(cache, lookup, upstream)
        async for _ in stream:
            pass

    async def both():
        await asyncio.gather(one("What is 17 times 23?"), one("What is 17 times 24?"))

    run(both())
    assert calls == 2


def test_leader_leaving_does_not_cut_off_followers(cache: SemanticCache, tenant: str, run: Run):
    async def upstream():
        for i in range(5):
            await asyncio.sleep(0.03)
            yield str(i)

    async def scenario() -> str:
        request = ask("Which plan includes SSO?", tenant)
        lookup = await cache.lookup(request)
        _, lead = await _coalesced(cache, lookup, upstream)
        _, follow = await _coalesced(cache, lookup, upstream)
        await lead.__anext__()
        await lead.aclose()  # the leader's client disconnects
        return "".join([c async for c in follow])

    assert run(scenario()) == "01234"


@pytest.mark.parametrize("finish", ["length", None])
def test_unfinished_answers_are_not_stored(cache: SemanticCache, tenant: str, run: Run, finish):
    request = ask("Write a long poem about the sea", tenant)
    assert run(cache.store_answer(request, CompletionOutcome("The sea", finish))) is None
    assert run(cache.lookup(request)).status == "miss"
    assert cache.stats.store_skips == 1


def test_prompts_past_the_embedder_window_use_the_exact_tier_only(
    cache: SemanticCache, tenant: str, run: Run
):
    long_q = "Summarise this log: " + "error at line 7 in the parser; " * 120
    assert not cache.embedder.fits(long_q) and cache.embedder.fits("short question?")
    miss = run(cache.lookup(ask(long_q, tenant)))
    assert miss.status == "miss" and miss.vector is None and "exact tier" in (miss.reason or "")
    run(cache.store_answer(ask(long_q, tenant), DONE))
    assert run(cache.lookup(ask(long_q, tenant))).hit.tier == "exact"


def test_each_hit_counts_what_its_entry_saved_by_tenant_and_model(
    cache: SemanticCache, tenant: str, run: Run
):
    """A stored answer's tokens and time are counted per hit, exact or semantic, under its
    tenant and model; a seeded one counts its tokens and no time; dry runs count nothing."""
    usage = {"prompt_tokens": 12, "completion_tokens": 7, "generation_seconds": 0.25}
    run(cache.store_answer(ask("What is the capital of France?", tenant), DONE, metadata=usage))
    other = tenant + "-other"
    run(cache.seed("How tall is Mount Everest?", "8,849 m.", model="m2", tenant=other,
                   usage={"prompt_tokens": 9, "completion_tokens": 5}))  # fmt: skip
    # No usage, no time (an upstream that sent no usage, stored before times were kept).
    hamlet = ask("Who wrote Hamlet?", tenant, model="m3")
    run(cache.store_answer(hamlet, CompletionOutcome("Shakespeare.", "stop")))

    for question in ("What is the capital of France?", "Tell me the capital city of France"):
        assert run(cache.lookup(ask(question, tenant))).status == "hit"
    run(cache.lookup(ask("What is the capital of France?", tenant), dry_run=True))
    assert run(cache.lookup(ask("How tall is Mount Everest?", other, model="m2"))).hit
    assert run(cache.lookup(hamlet)).status == "hit"
    assert run(cache.lookup(ask("Why is the sky blue?", tenant))).status == "miss"

    saved = cache.stats.snapshot()["saved"]
    assert saved == {
        tenant: {"m": {"hits": 2, "completion_tokens": 14, "prompt_tokens": 24, "seconds": 0.5,
                       "hits_without_tokens": 0, "hits_without_seconds": 0},
                 "m3": {"hits": 1, "completion_tokens": 0, "prompt_tokens": 0, "seconds": 0.0,
                        "hits_without_tokens": 1, "hits_without_seconds": 1}},
        other: {"m2": {"hits": 1, "completion_tokens": 5, "prompt_tokens": 9, "seconds": 0.0,
                       "hits_without_tokens": 0, "hits_without_seconds": 1}},
    }  # fmt: skip


def test_without_the_multilingual_tier_other_languages_get_the_exact_tier_only(
    cache: SemanticCache, tenant: str, run: Run
):
    french = "Quelle est la capitale de l'Australie ?"
    stored = run(cache.store_answer(ask(french, tenant), CompletionOutcome("Canberra.", "stop")))
    assert stored is not None and stored.metadata["language"] == "fr"
    again = run(cache.lookup(ask(french, tenant)))
    assert again.hit is not None and again.hit.tier == "exact"

    # No tier embeds French here: a rewording is a miss with no candidate at all.
    reworded = run(cache.lookup(ask("C'est quoi la capitale de l'Australie ?", tenant)))
    assert reworded.status == "miss" and reworded.candidates == []
    # An English question is never served the French answer: the French entry has no
    # vector of the English tier's.
    english = run(cache.lookup(ask("What is the capital of Australia?", tenant), dry_run=True))
    assert not [c for c in english.candidates if c.candidate.entry.response == "Canberra."]
    assert cache.snapshot()["languages"]["fr"] == {
        "tier": "exact only",
        "lookups": 2,
        "hits": 1,
    }


def test_a_lookup_deadline_does_not_count_the_wait_for_a_busy_embedder(
    store: CacheStore, embedder: Embedder, tenant: str, run: Run
):
    """Inside a burst the question waits behind others' texts (their queue is bounded),
    and that wait is not charged to the lookup's deadline: the paraphrase still hits.
    Past the queue's bound the lookup fails open at once ("busy")."""
    # The deadline leaves the lookup's own steps room on a loaded machine, and the crowd
    # (60 texts, under the queue's bound of 64) takes about twice as long to embed.
    cache = SemanticCache(store, embedder, timeout=0.5)
    run(cache.seed("What is the capital of France?", DONE.text, model="m", tenant=tenant))
    tag = tenant

    async def inside(crowd: int, question: str) -> LookupResult:
        waits = [asyncio.ensure_future(embedder.embed(t)) for t in long_texts(tag, crowd)]
        await asyncio.sleep(0)  # the crowd's texts are queued (~35 ms each, two workers)
        result = await cache.lookup(ask(question, tenant))
        await asyncio.gather(*waits)
        return result

    waited = run(inside(60, "What is France's capital city called?"))
    assert waited.status == "hit" and waited.embed_seconds is not None
    assert waited.embed_seconds > cache.timeout  # longer than the deadline, and still a hit

    tag += "-again"  # a new crowd (the first one's vectors are remembered)
    refused = run(inside(100, "Name the capital city of France, please."))
    assert refused.status == "error" and refused.reason is not None and "busy" in refused.reason
    assert cache.stats.errors["busy"] == 1
