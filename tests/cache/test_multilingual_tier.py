"""The tiers as a list, against the real Redis and both real embedders: a question in
another language is answered from entries in its own language only, by the multilingual
tier; a language nothing is fitted for keeps the exact tier; stats count hits by tier and
lookups by language."""

from __future__ import annotations

from pathlib import Path

from bench.calibrate import calibrate, load_pairs
from cache import CompletionOutcome, SemanticCache
from tests.cache.fixtures import Run, ask

DATA = Path(__file__).parents[2] / "data"
ANSWER = CompletionOutcome("Il faut un visa de visiteur ou une AVE.", "stop")


def test_a_french_paraphrase_hits_the_multilingual_tier(
    every_tier_cache: SemanticCache, tenant: str, run: Run
):
    cache = every_tier_cache
    question = "Est-ce que j'ai besoin d'un visa pour aller au Canada ?"
    assert run(cache.lookup(ask(question, tenant))).status == "miss"
    stored = run(cache.store_answer(ask(question, tenant), ANSWER))
    assert stored is not None and stored.metadata["language"] == "fr"

    para = run(cache.lookup(ask("Faut-il un visa pour voyager au Canada ?", tenant)))
    assert para.hit is not None and para.hit.tier == "semantic-multilingual", para.candidates
    assert para.hit.entry.response == ANSWER.text

    near = run(cache.lookup(ask("Est-ce que j'ai besoin d'un visa pour aller au Brésil ?", tenant)))
    assert near.status == "miss" and near.best is not None and near.best.rejected
    assert near.best.verdict is not None and near.best.verdict.rule == "entities"

    snapshot = cache.snapshot()
    assert snapshot["hits_by_tier"] == {"semantic-multilingual": 1}
    assert snapshot["languages"]["fr"]["lookups"] == 3 and snapshot["languages"]["fr"]["hits"] == 1
    assert snapshot["languages"]["fr"]["tier"] == "semantic-multilingual"
    assert 0 < snapshot["languages"]["fr"]["threshold"] < 1


def test_an_answer_is_served_only_in_its_own_language(
    every_tier_cache: SemanticCache, tenant: str, run: Run
):
    cache = every_tier_cache
    english = "How do I cancel my subscription?"
    run(cache.store_answer(ask(english, tenant), CompletionOutcome("Go to Settings.", "stop")))
    spanish = run(cache.lookup(ask("¿Cómo cancelo mi suscripción?", tenant), dry_run=True))
    # The Spanish question is looked up among Spanish entries only: the English one is
    # never even a candidate.
    assert spanish.status == "miss" and spanish.candidates == []
    assert run(cache.lookup(ask("How can I cancel my subscription?", tenant))).hit is not None


def test_a_language_nothing_is_fitted_for_keeps_the_exact_tier(
    every_tier_cache: SemanticCache, tenant: str, run: Run
):
    cache = every_tier_cache
    question = "Hur lång är Eiffeltornet?"  # Swedish
    run(cache.store_answer(ask(question, tenant), CompletionOutcome("330 meter.", "stop")))
    again = run(cache.lookup(ask(question, tenant)))
    assert again.hit is not None and again.hit.tier == "exact"
    reworded = run(cache.lookup(ask("Hur hög är Eiffeltornet?", tenant), dry_run=True))
    assert reworded.status == "miss" and reworded.candidates == []
    languages = cache.snapshot()["languages"]
    assert languages["sv"]["tier"] == "exact only" and languages["sv"]["hits"] == 1


def test_calibration_goal_on_the_multilingual_fit_set(every_tier_cache: SemanticCache, run: Run):
    """Served through the real cache, every hit counted: precision >= 0.95, recall >= 0.5."""
    pairs = load_pairs(DATA / "cache_multilingual_c.jsonl")
    report = run(calibrate(every_tier_cache, pairs), timeout=300)
    assert report.with_guard.precision_all_hits >= 0.95, report.with_guard
    assert report.with_guard.recall >= 0.5, report.with_guard
