"""What the English verifier weighs of a pair the certain rules passed (`pair_features`):
the embeddings' similarity, the cross-encoder's logit, how much wording the two
questions share and which grey-zone rules found something."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from cache.guard import cross_encoder, lexicon
from cache.guard.compare import SYNONYMS
from cache.guard.features import Features
from cache.guard.rules import GREY_RULES
from cache.guard.verifier import overlap_features
from cache.guard.words import stem

CROSS = "cross"  # the verifier's feature that is the cross-encoder's logit

# Words that only frame a question ("explain", "define", "mean"): a question that adds one
# asks the same thing, and they do not count as content words the two do not share.
_FRAMING = frozenset(stem(w) for w in lexicon.NON_NARROWING) | lexicon.NON_NARROWING


def _answer_type(f: Features) -> int | None:
    """Where a noun naming the answer's kind follows "which"/"what" ("which city is ..."),
    if one does."""
    for i in range(1, len(f.words)):
        if f.words[i - 1] in ("which", "what") and f.words[i] in lexicon.ANSWER_TYPE_NOUNS:
            return i
    return None


def _same_words(ca: list[str], cb: list[str]) -> bool:
    """The same content words (stems), in order, each the other's or a listed synonym
    ("built" and "constructed"). Not `alike`'s looser kin: "button" is not "buttonhole",
    nor "linux" "ubuntu"."""
    return len(ca) == len(cb) and all(
        x == y or y in SYNONYMS.get(x, ()) for x, y in zip(ca, cb, strict=True)
    )


def pair_features(
    a: Features, b: Features, similarity: float, grey: Collection[str], cross: float
) -> dict[str, float]:
    """What the verifier weighs of a pair the certain rules passed: the similarity; the
    cross-encoder's logit (`cross`) that the two ask the same thing; whether
    the two have the same content words (framing words aside, synonyms alike) and, when
    not, how much of
    their wording they share (all words: in common, in the same order, as adjacent pairs;
    content words in common, whether each side has one the other lacks, a word exchanged,
    and how many one side adds; whether one is the other with words added, alone and
    scaled by the similarity): a pair that keeps most words but changes one is another
    question more often than not, one that keeps every content word is rewording; and
    which grey rules found something (`grey`), alone and scaled by the similarity (a
    synonym exchanged scores higher than another thing named)."""
    ta, tb = _answer_type(a), _answer_type(b)
    # Only one side naming the answer's kind ("which city" beside "what") asks the same;
    # two kinds named are compared as content ("which city" vs "which country").
    ca = [
        w
        for i, w in zip(a.content_at, a.content, strict=True)
        if w not in _FRAMING and (i != ta or tb is not None)
    ]
    cb = [
        w
        for i, w in zip(b.content_at, b.content, strict=True)
        if w not in _FRAMING and (i != tb or ta is not None)
    ]
    differs = float(not _same_words(ca, cb))
    shared = overlap_features(a.words, b.words)
    only = (len(set(ca) - set(cb)), len(set(cb) - set(ca)))
    union = set(ca) | set(cb)
    # One question is the other with words added ("the health benefits of ..."): how
    # much such an addition matters depends on the similarity more than on the wording.
    inserted = differs * float(_within(a.words, b.words) or _within(b.words, a.words))
    values = {
        "similarity": similarity,
        CROSS: clipped(cross),
        "same_content": 1.0 - differs,
        **{name: value * differs for name, value in shared.items()},
        "content_jaccard": differs * (len(set(ca) & set(cb)) / len(union) if union else 1.0),
        "exchanged": float(min(only) > 0),
        "added": float(max(only)),
        "similarity_x_sequence": similarity * shared["sequence"] * differs,
        "inserted": inserted,
        "inserted_x_similarity": inserted * similarity,
    }
    for name in GREY_RULES:
        found = float(name in grey)
        values[name] = found
        values[f"{name}_x_similarity"] = found * similarity
    return values


def clipped(logit: float) -> float:
    """The cross-encoder's logit as the verifier reads it: within +-`cross_encoder.BOUND`."""
    return max(-cross_encoder.BOUND, min(cross_encoder.BOUND, logit))


def _within(short: Sequence[str], long: Sequence[str]) -> bool:
    """Whether `short` is `long` with words left out (a subsequence, in order)."""
    rest = iter(long)
    return len(short) < len(long) and all(w in rest for w in short)
