"""The language a question is asked in. The guard reads English only (its word lists,
question types and phrase rules), so it lets no other language through its semantic
checks: such questions get the exact tier only.

py3langid (langid.py's model, shipped inside the package: nothing is downloaded) scores
the languages in ~50-100 us a question, choosing among CANDIDATES, the widely used ones.
Its top label is a poor test on short questions: over all of its 97 languages it named
another language for 221 of the 9,599 English questions of data/*.jsonl ("350 fahrenheit
to celsius": German, 0.65). The probability it gives English separates them better: a
text counts as English when that is at least MIN_ENGLISH, unless it has letters of
another script (Cyrillic, Greek, CJK, kana, Hangul, Arabic, ...). Chosen on
data/cache_multilingual_a.jsonl (none of its 122 Latin-script questions reaches 0.03;
the highest, "qual a capital do brasil", 0.029) and the English sets (6 of 9,599 below
it: "meiosis vs mitosis", "mona lisa painter", "== vs === js", two quoting French, one
conversion; they keep the exact tier only); data/cache_multilingual_b.jsonl is held back.
"""

from __future__ import annotations

import functools
import re

from py3langid.langid import MODEL_FILE, LanguageIdentifier

ENGLISH = "en"
MIN_ENGLISH = 0.03  # the model's normalised probability of English
# The languages the model chooses among (ISO 639-1).
CANDIDATES = (
    "en", "fr", "es", "de", "it", "pt", "nl", "sv", "da", "no", "pl", "ru", "zh", "ja",
    "ko", "ar", "tr", "vi", "id", "cs", "ro", "hu", "fi", "el", "he", "hi", "uk", "th",
)  # fmt: skip
# Letters outside the Latin script (and its extensions and combining marks).
_OTHER_SCRIPT = re.compile(
    r"[\u0370-\u03ff\u0400-\u052f\u0530-\u058f\u0590-\u05ff\u0600-\u06ff\u0900-\u0dff"
    r"\u0e00-\u0eff\u1100-\u11ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]"
)


@functools.cache
def _identifier() -> LanguageIdentifier:
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    identifier.set_languages(CANDIDATES)
    return identifier


@functools.lru_cache(maxsize=4096)
def language(text: str) -> str:
    """ISO 639-1 code of the language `text` is in: "en" unless it is clearly not
    ("und" for another script the model takes for English)."""
    ranked = _identifier().rank(text)
    english = dict(ranked)[ENGLISH] >= MIN_ENGLISH
    if _OTHER_SCRIPT.search(text):
        top = next(label for label, _ in ranked)
        return "und" if top == ENGLISH else top
    if english:
        return ENGLISH
    return next(label for label, _ in ranked if label != ENGLISH)
