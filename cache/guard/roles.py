"""The roles of a question's phrases: the direction of "A to B", the sides of "A than
B", who does what to whom, and what replaces what."""

from __future__ import annotations

from cache.guard import lexicon
from cache.guard.words import number_value, stem


def phrase_roles(words: list[str]) -> dict[str, str]:
    """Direction of "A to B", "from A", "A than B", who does what in "who did A beat",
    what replaces what: anchors (content words) get a role; an anchor seen in two roles
    is dropped as ambiguous."""
    roles: dict[str, set[str]] = {}

    def canonical(word: str) -> str:
        return lexicon.UNITS.get(word) or lexicon.ENTITY_ALIASES.get(word) or stem(word)

    def anchor(start: int, step: int, skip_comparatives: bool = False) -> str | None:
        i, seen = start, 0
        while 0 <= i < len(words) and seen < 4:
            word = words[i]
            # "from you to another carrier": the anchor of "from" is not past the "to".
            if word in lexicon.CLAUSE_BREAKS or word in lexicon.DIRECTION_WORDS:
                return None
            comparative = skip_comparatives and (
                word in lexicon.COMPARATIVE_WORDS or (word.endswith("er") and len(word) > 4)
            )
            if word not in lexicon.STOPWORDS and not comparative and number_value(word) is None:
                return canonical(word)
            i += step
            seen += 1
        return None

    def mark(word: str | None, role: str) -> None:
        if word:
            roles.setdefault(word, set()).add(role)

    def head(start: int) -> str | None:
        """The last word of the phrase that starts at `start` ("baking soda in pancakes":
        soda), past any leading articles."""
        last = None
        for word in words[start:]:
            if word in lexicon.STOPWORDS or number_value(word) is not None:
                if last is not None or word not in lexicon.ARTICLES:
                    break
                continue
            last = canonical(word)
        return last

    def after(start: int, word: str) -> int | None:
        return next((j + 1 for j in range(start, len(words)) if words[j] == word), None)

    has_from = "from" in words
    for i, word in enumerate(words):
        left, right = anchor(i - 1, -1), anchor(i + 1, 1)
        if (
            word in {"in", "to", "into"}
            and left in lexicon.UNIT_NAMES
            and right in lexicon.UNIT_NAMES
        ):
            mark(left, "src")  # "100 dollars in euros": a conversion from dollars
            mark(right, "dst")
        elif word == "from":
            mark(anchor(i - 1, -1), "dst")
            mark(anchor(i + 1, 1), "src")
        elif word == "of" and words[i - 1 : i] == ["out"]:  # "copy a file out of a container"
            mark(anchor(i + 1, 1), "src")
        # "who did South Africa beat" asks whom South Africa beat; "who beat South Africa"
        # who beat it: the same name is the agent in one, the patient in the other.
        elif word in {"who", "whom", "which"}:
            # "which team did X beat": the verb follows the noun.
            at = i + 2 if word == "which" else i + 1
            verb = words[at] if at + 1 < len(words) else None
            if verb in lexicon.DOING_AUXILIARIES:
                mark(anchor(at + 1, 1), "agent")
            elif verb not in lexicon.STOPWORDS and verb not in lexicon.CLAUSE_BREAKS:
                mark(anchor(at + 1, 1), "patient")
        elif word in lexicon.DIRECTIONAL_TO and (has_from or lexicon.MOTION_WORDS & set(words)):
            if not has_from:
                mark(anchor(i - 1, -1), "src")
            mark(anchor(i + 1, 1), "dst")
        elif word == "than":
            mark(anchor(i - 1, -1, skip_comparatives=True), "src")
            mark(anchor(i + 1, 1), "dst")
        # What replaces what: "use A instead of B", "A in place of B", "substitute A for
        # B", "replace B with A".
        elif word == "of" and words[i - 1 : i] == ["instead"]:
            mark(anchor(i - 2, -1), "replacement")
            mark(head(i + 1), "replaced")
        elif word == "of" and words[i - 2 : i] == ["in", "place"]:
            mark(anchor(i - 3, -1), "replacement")
            mark(head(i + 1), "replaced")
        elif word in {"substitute", "replace"}:
            joint = after(i + 1, "for" if word == "substitute" else "with")
            if joint is not None:
                first, second = head(i + 1), head(joint)
                if word == "replace":
                    first, second = second, first
                mark(first, "replacement")
                mark(second, "replaced")
    return {word: next(iter(r)) for word, r in roles.items() if len(r) == 1}
