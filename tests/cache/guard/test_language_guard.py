"""The checks that hold in any language, and the multilingual verifier, pair by pair
(pairs from the fit sets' kinds; the held-back sets are never read here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cache import LanguageGuard, MultilingualEmbedder
from cache.guard import language_features as features_module
from cache.guard.language_features import language_features

WORDS = Path(features_module.__file__).with_name("language_words.json")

NEAR_MISSES = [
    ("Combien font 50 euros en dollars ?", "Combien font 500 euros en dollars ?", "numbers"),
    ("100美元等于多少人民币？", "200美元等于多少人民币？", "numbers"),
    ("Сколько рублей в 100 долларах?", "Сколько долларов в 100 рублях?", "units"),
    ("Comment convertir 20 miles en kilomètres ?", "Comment convertir 20 kilomètres en miles ?",
     "units"),
    ("Kann man Brot einfrieren?", "Kann man Brot nicht einfrieren?", "negation"),
    ("¿Se puede pagar con tarjeta?", "¿No se puede pagar con tarjeta?", "negation"),
    ("Кто написал «Войну и мир»?", "Кто написал «Анну Каренину»?", "literal"),
    ("《红楼梦》的作者是谁？", "《西游记》的作者是谁？", "literal"),
    ("Est-ce que j'ai besoin d'un visa pour le Canada ?",
     "Est-ce que j'ai besoin d'un visa pour le Brésil ?", "entities"),
    ("Wer hat die Relativitätstheorie entwickelt?",
     "Wann wurde die Relativitätstheorie entwickelt?", "question_type"),
    ("Quem pintou a Mona Lisa?", "Onde está a Mona Lisa?", "question_type"),
    ("What is the capital of France?", "Quelle est la capitale de la France ?", "language"),
    ("Ist die Apotheke am Samstag geöffnet?", "Ist die Apotheke am Sonntag geöffnet?", "days"),
    ("明天北京天气怎么样？", "今天北京天气怎么样？", "days"),
    ("Как включить автоплатёж?", "Как отключить автоплатёж?", "opposites"),
    ("Como ativo a autenticação em dois fatores?", "Como desativo a autenticação em dois fatores?",
     "opposites"),
    ("怎么打开蓝牙？", "怎么关闭蓝牙？", "opposites"),
    ("블루투스를 활성화하는 방법", "블루투스를 비활성화하는 방법", "opposites"),
    ("Hoe zet ik de meldingen aan?", "Hoe zet ik de meldingen uit?", "opposites"),
    ("Vale la pena comprare casa adesso?", "Vale la pena vendere casa adesso?", "opposites"),
]  # fmt: skip


@pytest.mark.parametrize(("cached", "query", "rule"), NEAR_MISSES)
def test_near_misses_are_told_apart_in_any_language(cached: str, query: str, rule: str):
    verdict = LanguageGuard().check(cached, query)
    assert not verdict.ok and verdict.rule == rule, verdict
    assert verdict.detail


@pytest.mark.parametrize(
    ("cached", "query"),
    [
        ("100美元等于多少人民币？", "一百美元能换多少人民币"),  # Chinese numerals are numbers
        ("感冒了可以喝咖啡吗？", "感冒期间能不能喝咖啡？"),  # 能不能 asks, it does not negate
        ("Quelle est la capitale de l'Australie ?", "c'est quoi la capitale de l'australie"),
        ("Сколько километров в 5 милях?", "Пять миль — это сколько километров?"),
        ("Wie kündige ich meinen Handyvertrag?", "Wie kann ich meinen Mobilfunkvertrag kündigen?"),
        ("¿Abre el banco el sábado?", "¿el banco abre los sabados?"),  # one day, two spellings
        ("Что приготовить на завтрак?", "Какой завтрак приготовить?"),  # breakfast, not tomorrow
        # one side of a pair of opposites, said in other words, is no opposite
        ("블루투스를 비활성화하는 방법", "블루투스는 어떻게 비활성화하나요"),
        ("Comment désactiver les notifications ?", "Je veux désactiver les notifs"),
    ],
)
def test_paraphrases_pass_the_certain_checks(cached: str, query: str):
    assert LanguageGuard().check(cached, query).ok


def _similarity(embedder: MultilingualEmbedder, a: str, b: str) -> float:
    va, vb = embedder.embed_many([a, b])
    return float(np.dot(va, vb))


def test_the_verifier_serves_a_rewording_and_refuses_one_word_changed(
    multilingual: MultilingualEmbedder,
):
    guard = LanguageGuard()
    para = (
        "Comment annuler mon abonnement ?",
        "Je voudrais résilier mon abonnement, comment faire ?",
    )
    assert guard.check(*para, _similarity(multilingual, *para)).ok
    near = ("Как изменить пароль от аккаунта?", "Как изменить логин от аккаунта?")
    verdict = guard.check(*near, _similarity(multilingual, *near))
    assert not verdict.ok and verdict.rule == "verifier", verdict


def test_a_language_without_a_threshold_has_no_semantic_tier():
    guard = LanguageGuard()
    assert {"fr", "es", "de", "pt", "it", "nl", "zh", "ja", "ko", "ru"} <= guard.languages
    assert "sv" not in guard.languages
    verdict = guard.check("Hur gammal är Stockholm?", "Hur gammal är staden Stockholm?", 0.99)
    assert not verdict.ok and verdict.rule == "language"


def test_features_read_numbers_names_and_quotes():
    f = language_features("Kostet 2 Bücher „Faust“ in Berlin 20 Euro?", "de")
    assert f.numbers == (2.0, 20.0)
    assert f.quoted == frozenset({"faust"})
    assert f.names == frozenset()  # German capitalises every noun: no names by capitals
    ja = language_features("iPhoneで二人分の予約はできませんか？", "ja")
    assert ja.numbers == (2.0,) and ja.names == frozenset({"iphone"}) and ja.negations == 1


def test_an_opposite_is_named_as_each_question_says_it():
    verdict = LanguageGuard().check("Как отключить автоплатёж?", "Как включить автоплатёж?")
    assert verdict.rule == "opposites" and verdict.detail == "выключ... vs включ..."


def test_opposites_are_read_by_word_beginnings_or_inside_the_text():
    pairs = features_module.OPPOSITES
    ru = language_features("Как отключить уведомления?", "ru").opposites
    assert {pairs["ru"][i] for i, side in ru if side == 1} >= {(("включ",), ("выключ", "отключ"))}
    # "비활성화" holds "활성화": the longer is taken out before the shorter is looked for
    ko = language_features("블루투스 비활성화", "ko").opposites
    assert [side for i, side in ko if "활성화" in pairs["ko"][i][0]] == [1]
    # a trailing "$" asks for the whole word: "uitgebreid" says nothing of "uit"
    assert language_features("Een uitgebreide handleiding", "nl").opposites == frozenset()


def test_each_word_list_says_what_it_is_for_and_covers_the_fitted_languages():
    lists = json.loads(WORDS.read_text(encoding="utf-8"))
    fitted = LanguageGuard().languages
    for name, entry in lists.items():
        assert entry["description"] and entry["example"], name
        assert set(entry) == {"description", "example", "by_language"}, name
        words = json.dumps(entry["by_language"], ensure_ascii=False)
        assert words == words.lower(), name
    assert fitted <= set(lists["negations"]["by_language"])
    assert fitted <= set(lists["question_words"]["by_language"])
    assert fitted <= set(lists["opposites"]["by_language"])
