"""Which questions the guard reads (cache/language.py), on the labelled sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache.language import ENGLISH, language

DATA = Path(__file__).resolve().parents[2] / "data"


def _questions(pattern: str, *, cross_language: bool = True) -> list[str]:
    texts: list[str] = []
    for path in sorted(DATA.glob(pattern)):
        for line in path.read_text().splitlines():
            pair = json.loads(line)
            texts.append(pair["query"])
            if cross_language or ">" not in pair.get("lang", ""):
                texts.append(pair["cached"])
    return list(dict.fromkeys(texts))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What is the capital of Australia?", "en"),
        ("Convert 100 °C to Fahrenheit", "en"),
        ("¿Cómo cambio mi contraseña?", "es"),
        ("Wie setze ich mein Passwort zurück?", "de"),
        ("qual a capital do brasil", "pt"),
        ("Как дела?", "ru"),
        ("如何重置我的密码\uff1f", "zh"),
    ],
)
def test_examples(text: str, expected: str):
    assert language(text) == expected


def test_english_questions_are_read_as_english():
    english = _questions("cache_[hp]*.jsonl")
    assert len(english) > 9000
    others = [text for text in english if language(text) != ENGLISH]
    assert len(others) <= 6, others  # as measured when MIN_ENGLISH was chosen


def test_no_question_of_the_fit_multilingual_set_passes_for_english():
    # The other languages' questions of set a (its cross-language pairs' cached side is
    # English); set b is held back, scored by `semgate cache calibrate`.
    questions = _questions("cache_multilingual_a.jsonl", cross_language=False)
    assert len(questions) > 150
    assert [text for text in questions if language(text) == ENGLISH] == []
